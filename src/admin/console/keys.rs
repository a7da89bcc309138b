//! The keys that need a person — the unresolved ones, a page at a time through the store's
//! keyset listing (a page deep in 100,000 rows costs what the first does) — and one key's
//! story: where it stands, what happened to it and when, and what an operator may do.

use std::fmt::Write;

use super::html::{Viewer, esc, key_link, query_value, span, when};
use super::routes;
use crate::clock::now_ms;
use crate::proxy::Proxy;
use crate::store::{Inspect, KeyRecord, KeyState, KeyStore, PageMark};
use crate::stored::decode_stored;

/// Rows per page of the unresolved list.
pub(super) const PAGE: i64 = 50;

/// The unresolved keys from after `after`; `total`, the count (a few seconds old at most).
pub(super) async fn unresolved<S: KeyStore + Inspect>(
    proxy: &Proxy<S>,
    after: Option<&PageMark>,
    total: u64,
) -> Result<String, crate::store::StoreError> {
    let rows = proxy.store().stuck(after, PAGE + 1).await?;
    let more = rows.len() as i64 > PAGE;
    let rows = &rows[..rows.len().min(PAGE as usize)];
    let mut out = String::new();
    let _ = write!(
        out,
        "<p class=\"lede\">{total} unresolved key{} — in progress, lease run out: nobody knows whether the operation happened. \
         Longest unresolved first. A key the reconciler handles settles by itself; the others wait for a client's retry or for you.</p>",
        if total == 1 { "" } else { "s" }
    );
    if rows.is_empty() {
        out.push_str("<p>None on this page.</p>");
    } else {
        out.push_str(
            "<table class=\"keys\"><caption>Unresolved keys</caption><thead><tr>\
             <th scope=\"col\">Key</th><th scope=\"col\">Client</th><th scope=\"col\">Route</th>\
             <th scope=\"col\">Unresolved for</th><th scope=\"col\">Attempts</th>\
             <th scope=\"col\">Probe's last answer</th><th scope=\"col\">Next probe</th>\
             <th scope=\"col\">Settled by</th></tr></thead><tbody>",
        );
        let now = now_ms();
        for s in rows {
            let r = &s.record;
            let age = match r.state {
                KeyState::Unresolved { lease_expired_ms } => span(lease_expired_ms),
                _ => "—".into(),
            };
            let probe = match (&r.probe_answer, r.probes) {
                (Some(a), n) => format!("{} ({n} asked)", esc(a)),
                (None, 0) => "not asked".into(),
                (None, n) => format!("— ({n} asked)"),
            };
            let next = match r.probe_after_ms {
                _ if !reconciled(proxy, r) => "—".into(),
                Some(at) if at > now => format!("in {}", span(at - now)),
                _ => "next pass".into(),
            };
            let settled = if reconciled(proxy, r) {
                "the reconciler"
            } else {
                "a retry or you"
            };
            let _ = write!(
                out,
                "<tr><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td><td>{age}</td><td>{}</td><td>{probe}</td><td>{next}</td><td>{settled}</td></tr>",
                esc(&key_link(&r.client_id, &r.key)),
                esc(&r.key),
                esc(&r.client_id),
                esc(&r.route),
                r.attempts
            );
        }
        out.push_str("</tbody></table>");
    }
    out.push_str("<nav class=\"pages\" aria-label=\"Pages\">");
    if after.is_some() {
        out.push_str("<a href=\"/console/unresolved\">First page</a> ");
    }
    if more && let Some(last) = rows.last() {
        let _ = write!(
            out,
            "<a href=\"/console/unresolved?after={}\" rel=\"next\">Next page</a>",
            query_value(&last.mark.encode())
        );
    }
    out.push_str("</nav>");
    Ok(out)
}

/// Whether the reconciler settles this key by itself.
fn reconciled<S: KeyStore>(proxy: &Proxy<S>, r: &KeyRecord) -> bool {
    r.state.is_unresolved() && crate::admin::keys::reconciled(proxy, r)
}

/// The lookup form, filled with what was asked.
pub(super) fn lookup_form(client: &str, key: &str) -> String {
    format!(
        "<form class=\"lookup\" method=\"get\" action=\"/console/key\">\
         <label for=\"client\">Client id</label><input id=\"client\" name=\"client\" value=\"{}\" required autocomplete=\"off\">\
         <label for=\"key\">Idempotency key</label><input id=\"key\" name=\"key\" value=\"{}\" required autocomplete=\"off\">\
         <button type=\"submit\">Look up</button></form>",
        esc(client),
        esc(key)
    )
}

/// One key's story: `typed` is the key as the operator gave it, `r` its row.
pub(super) async fn story<S: KeyStore + Inspect>(
    proxy: &Proxy<S>,
    viewer: &Viewer<'_>,
    typed: &str,
    r: &KeyRecord,
    with_body: bool,
) -> String {
    let mut out = String::new();
    let now = now_ms();
    let (state, state_note) = match r.state {
        KeyState::InProgress { lease_remaining_ms } => (
            "in flight",
            format!(
                "A worker holds the lease for {} more; a retry now gets 409 (or waits, on a route with `on_conflict: wait`).",
                span(lease_remaining_ms)
            ),
        ),
        KeyState::Unresolved { lease_expired_ms } => (
            "unresolved",
            format!(
                "The lease ran out {} ago before an answer was stored: nobody knows whether the operation happened.",
                span(lease_expired_ms)
            ),
        ),
        KeyState::Done => (
            "answered",
            "The answer is stored: every retry with this key gets it replayed.".to_owned(),
        ),
    };
    let derived = r
        .derived_key
        .clone()
        .unwrap_or_else(|| format!("{}:{}", r.client_id, typed));
    let _ = write!(
        out,
        "<p class=\"state state-{}\"><strong>{state}</strong> — {}</p><dl class=\"facts\">",
        state.replace(' ', "-"),
        esc(&state_note)
    );
    let mut fact = |name: &str, value: String| {
        let _ = write!(out, "<dt>{name}</dt><dd>{value}</dd>");
    };
    fact("Client id", format!("<code>{}</code>", esc(&r.client_id)));
    fact("Key (as stored)", format!("<code>{}</code>", esc(&r.key)));
    fact("Route", esc(&r.route));
    fact(
        "Fingerprint",
        format!("<code>{}</code>", crate::key::hex(&r.fingerprint)),
    );
    fact(
        "Derived key sent upstream",
        format!("<code>{}</code>", esc(&derived)),
    );
    fact("Lease token", r.lease_token.to_string());
    fact("Attempts", r.attempts.to_string());
    if let Some(status) = r.response_status {
        fact("Stored status", status.to_string());
    }
    if let Some(ring) = &r.sealed_with {
        fact(
            "Sealed with",
            format!("<code>{}</code> (encryption at rest)", esc(ring)),
        );
    }
    let _ = write!(
        out,
        "</dl><h2>Timeline</h2><p class=\"lede\">From the row, and what this replica answered the key's requests (it remembers its last {} keys; other replicas answer theirs).</p><ol class=\"timeline\">",
        crate::proxy::JOURNAL_CAPACITY
    );
    // (when it sorts, when it happened if the row says, what): takeovers and probes keep no
    // time of their own.
    let mut events: Vec<(i64, Option<i64>, String)> = vec![(
        r.created_at_ms,
        Some(r.created_at_ms),
        "Reserved: the first request with this key was forwarded upstream".into(),
    )];
    if r.attempts > 1 {
        events.push((
            r.created_at_ms,
            None,
            format!(
                "Taken over {} time{} after a lease ran out: executed again under lease token {}",
                r.attempts - 1,
                if r.attempts == 2 { "" } else { "s" },
                r.lease_token
            ),
        ));
    }
    match r.state {
        KeyState::InProgress { lease_remaining_ms } => events.push((
            now,
            Some(now),
            format!(
                "Executing: lease renewed while the upstream runs, now until {}",
                when(now + lease_remaining_ms)
            ),
        )),
        KeyState::Unresolved { lease_expired_ms } => events.push((
            now - lease_expired_ms,
            Some(now - lease_expired_ms),
            "Lease ran out with no answer stored: unresolved".into(),
        )),
        KeyState::Done => {}
    }
    if r.probes > 0 {
        let next = r
            .probe_after_ms
            .map(|at| format!("; next probe not before {}", when(at)))
            .unwrap_or_default();
        events.push((
            now,
            None,
            format!(
                "Recovery probe asked {} time{}, last answer: {}{next}",
                r.probes,
                if r.probes == 1 { "" } else { "s" },
                esc(r.probe_answer.as_deref().unwrap_or("—"))
            ),
        ));
    }
    if let (Some(at), Some(status)) = (r.completed_at_ms, r.response_status) {
        let replayed = match r.replayable {
            Some(false) => {
                format!("Answered {status} — too large to store: retries get a problem saying so")
            }
            _ => format!(
                "Answered {status} and stored: retries since then got it replayed (<code>{}: true</code>)",
                routes::replayed_header(proxy, &r.route)
            ),
        };
        events.push((at, Some(at), replayed));
    }
    // What this replica answered the key's requests (the row keeps no replays).
    for seen in proxy
        .journal()
        .seen(&crate::key::key_hash(&r.client_id, typed))
    {
        let what = match seen.outcome {
            "replayed" => "Replayed the stored answer",
            "conflict" => "Answered a duplicate while in flight (409 or a wait)",
            "mismatch" => "Refused a different request reusing the key (422)",
            "outcome_unknown" => "Answered a retry: outcome unknown",
            "executed" => "Executed and answered",
            "released" => "Released after the upstream's answer",
            "store_error" => "Failed closed: the store could not be reached",
            "upstream_error" => "The upstream failed",
            other => other,
        };
        let times = if seen.count == 1 {
            String::new()
        } else {
            format!(" — {} times, last at {}", seen.count, when(seen.last_ms))
        };
        events.push((
            seen.first_ms,
            Some(seen.first_ms),
            format!(
                "{what} (status {}){times} <span class=\"note\">this replica</span>",
                seen.status
            ),
        ));
    }
    events.push((
        r.expires_at_ms,
        Some(r.expires_at_ms),
        "Retention ends: the sweep deletes the row; a request with this key afterwards executes afresh".into(),
    ));
    events.sort_by_key(|(at, _, _)| *at);
    for (_, at, what) in events {
        let at = at.map_or_else(|| "(time not kept)".to_owned(), when);
        let _ = write!(out, "<li>{at} — {what}</li>");
    }
    out.push_str("</ol>");
    if r.state == KeyState::Done {
        out.push_str(&answer(proxy, viewer, typed, r, with_body).await);
    }
    out.push_str(&super::actions::forms(viewer, typed, r));
    out
}

/// The stored answer: status and headers, the body only when asked for — never when it is
/// sealed or the route says not to show it.
async fn answer<S: KeyStore + Inspect>(
    proxy: &Proxy<S>,
    _viewer: &Viewer<'_>,
    typed: &str,
    r: &KeyRecord,
    with_body: bool,
) -> String {
    let mut out = String::from("<h2>Stored answer</h2>");
    if let Some(ring) = &r.sealed_with {
        let _ = write!(
            out,
            "<p>Sealed with <code>{}</code> (encryption at rest): the console never opens stored answers; its headers and body are not shown.</p>",
            esc(ring)
        );
        return out;
    }
    let stored = match proxy.store().answer(&r.client_id, &r.key).await {
        Ok(Some(a)) => a,
        Ok(None) => {
            out.push_str("<p>No answer is stored (too large to store, or changed since).</p>");
            return out;
        }
        Err(_) => {
            out.push_str("<p>The store cannot be reached to read the answer.</p>");
            return out;
        }
    };
    let _ = write!(
        out,
        "<p>Status <strong>{}</strong></p><table class=\"headers\"><caption>Stored headers</caption><thead><tr><th scope=\"col\">Name</th><th scope=\"col\">Value</th></tr></thead><tbody>",
        stored.status
    );
    for (name, value) in &decode_stored(&stored.headers) {
        let _ = write!(
            out,
            "<tr><td>{}</td><td><code>{}</code></td></tr>",
            esc(name.as_str()),
            esc(&String::from_utf8_lossy(value.as_bytes()))
        );
    }
    out.push_str("</tbody></table>");
    if !routes::body_shown(proxy, &r.route) {
        out.push_str(
            "<p>This route's stored bodies are not shown (<code>console_body: false</code>).</p>",
        );
    } else if with_body {
        let text = match std::str::from_utf8(&stored.body) {
            Ok(t) => esc(t),
            Err(_) => format!("({} bytes, not UTF-8 text)", stored.body.len()),
        };
        let _ = write!(
            out,
            "<h3>Body ({} bytes)</h3><pre class=\"body\" tabindex=\"0\">{text}</pre>",
            stored.body.len()
        );
    } else {
        let _ = write!(
            out,
            "<p><a href=\"{}&amp;body=1\">Show the stored body</a> ({} bytes)</p>",
            esc(&key_link(&r.client_id, typed)),
            stored.body.len()
        );
    }
    out
}
