//! The operator's console, in the browser, on the admin listener: an overview of what the
//! proxy is doing, the unresolved keys that need a person, one key's story, and the actions
//! an operator takes on a key — so that the 3 a.m. alert is answered without curl.
//!
//! Server-rendered HTML with one small script (the overview's refresh), compiled into the
//! binary: no CDN, no build step, works offline. Access is the admin tokens': a token is
//! entered once and exchanged for a session cookie (`session.rs`); every post carries the
//! session's CSRF token and must come from the console's own origin; every page is sent
//! with a strict Content-Security-Policy. A listener with no token configured serves no
//! console (its API is open to loopback callers, which a browser page must not become).

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::auth::Tokens;
use crate::body::ProxyBody;
use crate::proxy::Proxy;
use crate::store::{Inspect, KeyStore, Maintenance, PageMark};
use answer::{Refusal, asset, json, not_allowed, page_answer, redirect, store_down, wants_html};
use html::{Tab, Viewer, page};
use session::{Session, Sessions};

mod actions;
mod answer;
mod html;
mod keys;
mod overview;
mod routes;
mod session;
mod signin;

/// Largest form the console accepts (a stored answer's body is typed into one).
const MAX_FORM: usize = 1 << 20;

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// How long a count of the unresolved keys is used: counting walks the index of keys in
/// flight (tens of milliseconds at 100,000 unresolved keys), so the pages and every open
/// overview share one count at most this old.
const COUNT_FOR: Duration = Duration::from_secs(5);

/// The console's state: sessions, the counters' samples, the last unresolved count.
#[derive(Default)]
pub struct Console {
    sessions: Sessions,
    samples: overview::Samples,
    counted: tokio::sync::Mutex<Option<(std::time::Instant, Counts)>>,
}

/// Unresolved keys per route.
type Counts = Vec<(String, u64)>;

impl Console {
    /// The unresolved keys per route, counted at most [`COUNT_FOR`] ago; `None` when the
    /// store does not answer.
    async fn counts<S: KeyStore + Maintenance>(&self, proxy: &Proxy<S>) -> Option<Counts> {
        // One count at a time: requests arriving meanwhile wait for it and share it.
        let mut counted = self.counted.lock().await;
        if let Some((at, counts)) = counted.as_ref()
            && at.elapsed() < COUNT_FOR
        {
            return Some(counts.clone());
        }
        let counts =
            tokio::time::timeout(Duration::from_secs(5), proxy.store().unresolved_counts())
                .await
                .ok()?
                .ok()?;
        *counted = Some((std::time::Instant::now(), counts.clone()));
        Some(counts)
    }

    /// Samples the proxy's counters every few seconds, for the overview's rates; runs
    /// until dropped (the admin listener aborts it when it stops).
    pub async fn sample<S: KeyStore>(self: Arc<Self>, proxy: Proxy<S>) {
        loop {
            let text = proxy.metrics().render_classic();
            self.samples.record(overview::Snapshot::parse(&text));
            tokio::time::sleep(overview::SAMPLE_EVERY).await;
        }
    }
}

/// Whether `path` is the console's (the admin listener's other paths are the API's).
pub fn owns(path: &str) -> bool {
    path == "/" || path == "/console" || path.starts_with("/console/")
}

/// Answers one console request.
pub async fn handle<S: KeyStore + Inspect + Maintenance>(
    proxy: &Proxy<S>,
    tokens: &Tokens,
    console: &Console,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let html = wants_html(req.headers());
    match (&method, path.as_str()) {
        (&Method::GET, "/console" | "/console/") => return redirect("/", None),
        (&Method::GET, "/console/console.css") => return asset("text/css; charset=utf-8", CSS),
        (&Method::GET, "/console/console.js") => {
            return asset("text/javascript; charset=utf-8", JS);
        }
        _ => {}
    }
    if !tokens.any() {
        return Refusal::new(
            StatusCode::FORBIDDEN,
            "console-closed",
            "Console closed",
            "This proxy has no admin token, so its console is closed: the admin API stays open to loopback callers only, and a page in a browser must not be. Set admin_token (or IDEMPROXY_ADMIN_TOKEN) or admin_tokens and restart.",
        )
        .answer(html, None);
    }
    if method == Method::POST && !session::same_origin(req.headers()) {
        return Refusal::new(
            StatusCode::FORBIDDEN,
            "cross-site-post",
            "Posted from another site",
            "This form was posted from another site. The console takes posts from its own pages only.",
        )
        .answer(html, None);
    }
    if (&method, path.as_str()) == (&Method::POST, "/console/login") {
        return signin::login(tokens, console, html, req).await;
    }
    let Some((id, session)) = console.sessions.find(req.headers()) else {
        return match (&method, html) {
            (&Method::GET, true) => signin::login_page(StatusCode::UNAUTHORIZED, None),
            _ => Refusal::new(
                StatusCode::UNAUTHORIZED,
                "admin-unauthorized",
                "Signed out",
                "No console session: sign in at / with an admin token (POST /console/login, token=…).",
            )
            .then("/", "Sign in")
            .answer(html, None),
        };
    };
    let viewer = Viewer {
        who: &session.who,
        csrf: &session.csrf,
    };
    let query = req.uri().query().unwrap_or("").to_owned();
    let param = |name: &str| {
        form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let refused = |r: Refusal| r.answer(html, Some(&viewer));
    match (&method, path.as_str()) {
        (&Method::GET, "/") => {
            let figures = figures(proxy, console).await;
            let main = overview::render(&figures);
            page_answer(
                StatusCode::OK,
                page("Overview", Some(&viewer), Tab::Overview, &main),
            )
        }
        (&Method::GET, "/console/overview.json") => json(&figures(proxy, console).await),
        (&Method::GET, "/console/unresolved") => {
            let after = match param("after").map(|t| PageMark::decode(&t)) {
                None => None,
                Some(Some(mark)) => Some(mark),
                Some(None) => {
                    return refused(
                        Refusal::new(
                            StatusCode::BAD_REQUEST,
                            "bad-query",
                            "Invalid page link",
                            "That page link is not one the console made.",
                        )
                        .then("/console/unresolved", "Start from the first page"),
                    );
                }
            };
            let Some(counts) = console.counts(proxy).await else {
                return refused(store_down());
            };
            let total = counts.iter().map(|(_, n)| n).sum();
            match keys::unresolved(proxy, after.as_ref(), total).await {
                Ok(main) => page_answer(
                    StatusCode::OK,
                    page("Unresolved keys", Some(&viewer), Tab::Unresolved, &main),
                ),
                Err(_) => refused(store_down()),
            }
        }
        (&Method::GET, "/console/key") => {
            let (client, key) = (param("client"), param("key"));
            key_page(proxy, &viewer, html, client, key, param("body").is_some()).await
        }
        (&Method::POST, "/console/action") => action(proxy, &viewer, &session, html, req).await,
        (&Method::POST, "/console/logout") => {
            signin::logout(console, &id, &session, html, req).await
        }
        (_, "/" | "/console/overview.json" | "/console/unresolved" | "/console/key") => {
            refused(not_allowed("GET"))
        }
        (_, "/console/action" | "/console/logout" | "/console/login") => {
            refused(not_allowed("POST"))
        }
        _ => refused(
            Refusal::new(
                StatusCode::NOT_FOUND,
                "not-found",
                "Not found",
                "No such console page.",
            )
            .then("/", "Overview"),
        ),
    }
}

/// The overview's figures: the sampled counters and the store's unresolved count.
async fn figures<S: KeyStore + Maintenance>(
    proxy: &Proxy<S>,
    console: &Console,
) -> overview::Figures {
    let now = overview::Snapshot::parse(&proxy.metrics().render_classic());
    let mut figures = console.samples.figures(now);
    match console.counts(proxy).await {
        Some(counts) => {
            figures.unresolved = Some(counts.iter().map(|(_, n)| n).sum());
            figures.unresolved_by_route = counts;
        }
        None => figures.store_answers = false,
    }
    figures
}

/// `GET /console/key`: the lookup form, and the story of the key it names.
async fn key_page<S: KeyStore + Inspect>(
    proxy: &Proxy<S>,
    viewer: &Viewer<'_>,
    html: bool,
    client: Option<String>,
    key: Option<String>,
    with_body: bool,
) -> Response<ProxyBody> {
    let (Some(client), Some(key)) = (
        client.filter(|c| !c.is_empty()),
        key.filter(|k| !k.is_empty()),
    ) else {
        let main = format!(
            "<p class=\"lede\">The client id and the key as the client sent it (or as a listing shows it).</p>{}",
            keys::lookup_form("", "")
        );
        return page_answer(
            StatusCode::OK,
            page("Look up a key", Some(viewer), Tab::Key, &main),
        );
    };
    let stored = crate::admin::resolve::stored_key(proxy, &client, key.clone()).await;
    match proxy.store().lookup(&client, &stored).await {
        Ok(Some(record)) => {
            let mut main = keys::lookup_form(&client, &key);
            main.push_str(&keys::story(proxy, viewer, &key, &record, with_body).await);
            page_answer(StatusCode::OK, page("Key", Some(viewer), Tab::Key, &main))
        }
        Ok(None) if html => {
            let mut main = keys::lookup_form(&client, &key);
            main.push_str("<p role=\"status\">No row for this client id and key: never seen, released, evicted or swept. A request with it now executes afresh.</p>");
            page_answer(
                StatusCode::NOT_FOUND,
                page("Key", Some(viewer), Tab::Key, &main),
            )
        }
        Ok(None) => Refusal::new(
            StatusCode::NOT_FOUND,
            "no-such-key",
            "No such key",
            "No row for this client id and key (never seen, released, evicted or swept).",
        )
        .answer(false, None),
        Err(_) => store_down().answer(html, Some(viewer)),
    }
}

/// `POST /console/action`: the confirmation, or — confirmed — the action itself.
async fn action<S: KeyStore + Inspect>(
    proxy: &Proxy<S>,
    viewer: &Viewer<'_>,
    session: &Session,
    html: bool,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let refused = |r: Refusal| r.answer(html, Some(viewer));
    let form = match signin::read_form(req, session).await {
        Ok(f) => f,
        Err(r) => return refused(r),
    };
    let posted = actions::Posted::parse(&form);
    let bad = |detail: String| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            "bad-action",
            "Invalid action",
            detail,
        )
    };
    if posted.client.is_empty() || posted.key.is_empty() {
        return refused(bad("The form names no key.".into()));
    }
    let stored = crate::admin::resolve::stored_key(proxy, &posted.client, posted.key.clone()).await;
    if posted.confirm {
        return match actions::perform(proxy, viewer.who, &posted, &stored).await {
            Ok(main) => page_answer(StatusCode::OK, page("Done", Some(viewer), Tab::None, &main)),
            Err(detail) => refused(Refusal::new(
                StatusCode::CONFLICT,
                "action-refused",
                "Not done",
                detail,
            )),
        };
    }
    let record = match proxy.store().lookup(&posted.client, &stored).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            return refused(Refusal::new(
                StatusCode::NOT_FOUND,
                "no-such-key",
                "No such key",
                "No row for this client id and key (released, evicted or swept meanwhile).",
            ));
        }
        Err(_) => return refused(store_down()),
    };
    match actions::confirm(proxy, viewer, &posted, &record) {
        Ok(main) => page_answer(
            StatusCode::OK,
            page("Confirm", Some(viewer), Tab::None, &main),
        ),
        Err(detail) => refused(bad(detail)),
    }
}
