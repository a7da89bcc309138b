//! What an operator may do to a key from the console — resolve an unresolved key with the
//! provider's answer, release it, evict any key — each in two steps: the form, then a
//! confirmation that says what the client's next retry will get; only the confirmed post
//! acts. Both steps are posts carrying the session's CSRF token; the action goes through
//! the same code as the admin API's, which logs the audit line naming the token.

use std::fmt::Write;

use super::html::{Viewer, esc, key_link};
use crate::admin::resolve::{Resolved, apply, retention_of, stored_answer};
use crate::proxy::Proxy;
use crate::store::{Inspect, KeyRecord, KeyState, KeyStore};

/// A posted action's fields.
pub(super) struct Posted {
    pub action: String,
    pub client: String,
    pub key: String,
    pub status: String,
    pub content_type: String,
    pub body: String,
    pub confirm: bool,
}

impl Posted {
    pub fn parse(form: &[(String, String)]) -> Self {
        let field = |name: &str| {
            form.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        Posted {
            action: field("action"),
            client: field("client"),
            key: field("key"),
            status: field("status"),
            content_type: field("content_type"),
            body: field("body"),
            confirm: field("confirm") == "yes",
        }
    }

    /// The fields again, hidden, for the confirmation's form.
    fn hidden(&self) -> String {
        let mut out = String::new();
        for (name, value) in [
            ("action", &self.action),
            ("client", &self.client),
            ("key", &self.key),
            ("status", &self.status),
            ("content_type", &self.content_type),
            ("body", &self.body),
        ] {
            let _ = write!(
                out,
                "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
                esc(value)
            );
        }
        out
    }
}

/// The action forms for a key in `r`'s state (`typed`: the key as the operator gave it).
pub(super) fn forms(viewer: &Viewer<'_>, typed: &str, r: &KeyRecord) -> String {
    let mut out = String::from("<h2>Actions</h2>");
    let hidden = |action: &str| {
        format!(
            "{}<input type=\"hidden\" name=\"action\" value=\"{action}\"><input type=\"hidden\" name=\"client\" value=\"{}\"><input type=\"hidden\" name=\"key\" value=\"{}\">",
            viewer.csrf_field(),
            esc(&r.client_id),
            esc(typed)
        )
    };
    if r.state.is_unresolved() {
        let _ = write!(
            out,
            "<section class=\"action\" aria-labelledby=\"resolve-done\"><h3 id=\"resolve-done\">It happened: store the provider's answer</h3>\
             <p>Found the operation at the provider? Store its answer: the client's retries get it replayed.</p>\
             <form method=\"post\" action=\"/console/action\">{}\
             <label for=\"status\">Status</label><input id=\"status\" name=\"status\" type=\"number\" min=\"100\" max=\"599\" value=\"201\" required>\
             <label for=\"content_type\">Content-Type</label><input id=\"content_type\" name=\"content_type\" value=\"application/json\">\
             <label for=\"body\">Body</label><textarea id=\"body\" name=\"body\" rows=\"5\"></textarea>\
             <button type=\"submit\">Review: store this answer</button></form></section>\
             <section class=\"action\" aria-labelledby=\"resolve-release\"><h3 id=\"resolve-release\">It did not happen: release the key</h3>\
             <p>The provider has no such operation? Release the key: the next retry executes it.</p>\
             <form method=\"post\" action=\"/console/action\">{}<button type=\"submit\">Review: release</button></form></section>",
            hidden("store"),
            hidden("release")
        );
    } else {
        out.push_str("<p>Only an unresolved key can be resolved.</p>");
    }
    let _ = write!(
        out,
        "<section class=\"action\" aria-labelledby=\"evict\"><h3 id=\"evict\">Evict</h3>\
         <p>Delete the row whatever its state.</p>\
         <form method=\"post\" action=\"/console/action\">{}<button type=\"submit\" class=\"danger\">Review: evict</button></form></section>",
        hidden("evict")
    );
    out
}

/// The confirmation page's main part: what will happen, what the next retry gets.
pub(super) fn confirm<S: KeyStore>(
    proxy: &Proxy<S>,
    viewer: &Viewer<'_>,
    posted: &Posted,
    r: &KeyRecord,
) -> Result<String, String> {
    let retention = crate::config::units::format_duration(retention_of(proxy, &r.route));
    let next = match posted.action.as_str() {
        "store" => {
            let answer = parse_answer(posted)?;
            format!(
                "The key is marked done with status <strong>{}</strong>{}. The client's next retry with this key — and every one for the route's retention, {retention} — gets this answer replayed (<code>{}: true</code>); nothing is forwarded upstream again.",
                answer.status,
                if posted.body.is_empty() {
                    ", with an empty body".to_owned()
                } else {
                    format!(" and a body of {} bytes", posted.body.len())
                },
                super::routes::replayed_header(proxy, &r.route)
            )
        }
        "release" => "The key is freed. The client's next retry with this key is <strong>forwarded upstream and executed</strong>, with the same derived key as before. Choose this only if the provider has no record of the operation.".to_owned(),
        "evict" => match r.state {
            KeyState::Done => "The stored answer is deleted. The client's next retry with this key is <strong>executed again upstream</strong> instead of getting the stored answer — a second charge, unless the provider deduplicates by the derived key.".to_owned(),
            KeyState::InProgress { .. } => "A worker is executing this key now. Evicting deletes its row: its answer will not be stored (its completion is refused), and the client's next retry is <strong>executed again upstream</strong> — possibly while the first is still running.".to_owned(),
            KeyState::Unresolved { .. } => "The row is deleted. The client's next retry with this key is <strong>executed again upstream</strong>; if the first attempt did happen, that is a second operation unless the provider deduplicates.".to_owned(),
        },
        other => return Err(format!("`{}` is not an action (store, release or evict).", other.escape_debug())),
    };
    let verb = match posted.action.as_str() {
        "store" => "Store the answer",
        "release" => "Release the key",
        _ => "Evict the key",
    };
    Ok(format!(
        "<p>Key <code>{}</code> of client <code>{}</code> (route {}).</p><p class=\"consequence\">{next}</p>\
         <form method=\"post\" action=\"/console/action\">{}{}<input type=\"hidden\" name=\"confirm\" value=\"yes\">\
         <button type=\"submit\" class=\"danger\">{verb}</button> <a href=\"{}\">Cancel</a></form>",
        esc(&r.key),
        esc(&r.client_id),
        esc(&r.route),
        viewer.csrf_field(),
        posted.hidden(),
        esc(&key_link(&r.client_id, &posted.key))
    ))
}

fn parse_answer(posted: &Posted) -> Result<crate::store::StoredResponse, String> {
    let status: u16 = posted
        .status
        .trim()
        .parse()
        .map_err(|_| "The status must be a number, 100–599.".to_owned())?;
    let content_type = posted.content_type.trim().to_owned();
    let name = "content-type".to_owned();
    let headers: Vec<(&String, &String)> = if content_type.is_empty() {
        Vec::new()
    } else {
        vec![(&name, &content_type)]
    };
    stored_answer(status, headers.into_iter(), &posted.body)
}

/// Performs a confirmed action as `who`; the result page's main part, or what refused it.
pub(super) async fn perform<S: KeyStore + Inspect>(
    proxy: &Proxy<S>,
    who: &str,
    posted: &Posted,
    stored_key: &str,
) -> Result<String, String> {
    let logged = crate::key::key_hash(&posted.client, &posted.key);
    let back = format!(
        "<p><a href=\"{}\">Back to the key</a> · <a href=\"/console/unresolved\">Unresolved keys</a></p>",
        esc(&key_link(&posted.client, &posted.key))
    );
    let refused = |e: crate::admin::error::AdminError| e.detail();
    match posted.action.as_str() {
        "store" | "release" => {
            let answer = match posted.action.as_str() {
                "store" => Some(parse_answer(posted)?),
                _ => None,
            };
            let Resolved { what, kept_seconds } =
                apply(proxy, &posted.client, stored_key, &logged, answer, who)
                    .await
                    .map_err(refused)?;
            let next = match kept_seconds {
                Some(_) => "The client's retries now get this answer replayed.",
                None => "The client's next retry executes the operation.",
            };
            Ok(format!(
                "<p class=\"done\" role=\"status\">Resolved: {what}. {next}</p>{back}"
            ))
        }
        "evict" => {
            let evicted =
                crate::admin::keys::evict(proxy, &posted.client, stored_key, &logged, who)
                    .await
                    .map_err(refused)?;
            Ok(if evicted {
                format!(
                    "<p class=\"done\" role=\"status\">Evicted: the next request with this key executes afresh.</p>{back}"
                )
            } else {
                format!("<p role=\"status\">Nothing to evict: the key has no row.</p>{back}")
            })
        }
        other => Err(format!(
            "`{}` is not an action (store, release or evict).",
            other.escape_debug()
        )),
    }
}
