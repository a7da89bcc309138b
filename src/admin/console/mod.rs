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

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use super::auth::Tokens;
use crate::body::{ProxyBody, full};
use crate::proxy::Proxy;
use crate::store::{Inspect, KeyStore, Maintenance, PageMark};
use html::{Tab, Viewer, esc, page};
use session::{Session, Sessions};

mod actions;
mod html;
mod keys;
mod overview;
mod session;

/// Largest form the console accepts (a stored answer's body is typed into one).
const MAX_FORM: usize = 1 << 20;

/// The page's rules: nothing but this origin's own script and style, no frames, no plugins,
/// forms only to this origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
    connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

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
    async fn counts<S: KeyStore + Maintenance>(
        &self,
        proxy: &Proxy<S>,
    ) -> Option<Vec<(String, u64)>> {
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
    match (&method, path.as_str()) {
        (&Method::GET, "/console" | "/console/") => return redirect("/"),
        (&Method::GET, "/console/console.css") => {
            return asset("text/css; charset=utf-8", CSS);
        }
        (&Method::GET, "/console/console.js") => {
            return asset("text/javascript; charset=utf-8", JS);
        }
        _ => {}
    }
    if !tokens.any() {
        return html(
            StatusCode::FORBIDDEN,
            page(
                "Console closed",
                None,
                Tab::None,
                "<p>This proxy has no admin token, so its console is closed: the admin API stays open to loopback callers only, and a page in a browser must not be. \
                 Set <code>admin_token</code> (or <code>IDEMPROXY_ADMIN_TOKEN</code>) or <code>admin_tokens</code> and restart.</p>",
            ),
        );
    }
    if method == Method::POST && !session::same_origin(req.headers()) {
        return html(
            StatusCode::FORBIDDEN,
            page(
                "Refused",
                None,
                Tab::None,
                "<p>This form was posted from another site. The console takes posts from its own pages only.</p>",
            ),
        );
    }
    if (&method, path.as_str()) == (&Method::POST, "/console/login") {
        return login(tokens, console, req).await;
    }
    let Some((id, session)) = console.sessions.find(req.headers()) else {
        return match (&method, path.as_str()) {
            (&Method::GET, _) => login_page(StatusCode::UNAUTHORIZED, None),
            _ => html(
                StatusCode::UNAUTHORIZED,
                page(
                    "Signed out",
                    None,
                    Tab::None,
                    "<p>Your session ended. <a href=\"/\">Sign in again</a>.</p>",
                ),
            ),
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
    match (&method, path.as_str()) {
        (&Method::GET, "/") => {
            let figures = figures(proxy, console).await;
            html(
                StatusCode::OK,
                page(
                    "Overview",
                    Some(&viewer),
                    Tab::Overview,
                    &overview::render(&figures),
                ),
            )
        }
        (&Method::GET, "/console/overview.json") => {
            let figures = figures(proxy, console).await;
            let mut resp = Response::new(full(serde_json::to_vec(&figures).unwrap_or_default()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            secure(resp)
        }
        (&Method::GET, "/console/unresolved") => {
            let after = match param("after") {
                None => None,
                Some(t) => match PageMark::decode(&t) {
                    Some(m) => Some(m),
                    None => {
                        return error_page(
                            &viewer,
                            StatusCode::BAD_REQUEST,
                            "That page link is not one the console made. <a href=\"/console/unresolved\">Start from the first page</a>.",
                        );
                    }
                },
            };
            let total = match console.counts(proxy).await {
                Some(counts) => counts.iter().map(|(_, n)| n).sum(),
                None => return store_down(&viewer),
            };
            match keys::unresolved(proxy, after.as_ref(), total).await {
                Ok(main) => html(
                    StatusCode::OK,
                    page("Unresolved keys", Some(&viewer), Tab::Unresolved, &main),
                ),
                Err(_) => store_down(&viewer),
            }
        }
        (&Method::GET, "/console/key") => {
            key_page(
                proxy,
                &viewer,
                param("client"),
                param("key"),
                param("body").is_some(),
            )
            .await
        }
        (&Method::POST, "/console/action") => action(proxy, &viewer, &session, req).await,
        (&Method::POST, "/console/logout") => {
            let form = match read_form(req, &session).await {
                Ok(f) => f,
                Err(resp) => return resp,
            };
            drop(form);
            console.sessions.close(&id);
            let mut resp = redirect("/");
            resp.headers_mut().insert(
                header::SET_COOKIE,
                HeaderValue::from_str(&session::clear_cookie())
                    .unwrap_or(HeaderValue::from_static("")),
            );
            resp
        }
        (_, "/" | "/console/overview.json" | "/console/unresolved" | "/console/key") => error_page(
            &viewer,
            StatusCode::METHOD_NOT_ALLOWED,
            "This page is read with GET.",
        ),
        (_, "/console/action" | "/console/logout" | "/console/login") => error_page(
            &viewer,
            StatusCode::METHOD_NOT_ALLOWED,
            "This address takes a form post.",
        ),
        _ => error_page(
            &viewer,
            StatusCode::NOT_FOUND,
            "No such page. <a href=\"/\">Overview</a>.",
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
        _ => figures.store_answers = false,
    }
    figures
}

async fn key_page<S: KeyStore + Inspect>(
    proxy: &Proxy<S>,
    viewer: &Viewer<'_>,
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
        return html(
            StatusCode::OK,
            page("Look up a key", Some(viewer), Tab::Key, &main),
        );
    };
    let stored = crate::admin::resolve::stored_key(proxy, &client, key.clone()).await;
    let mut main = keys::lookup_form(&client, &key);
    match proxy.store().lookup(&client, &stored).await {
        Ok(Some(record)) => {
            main.push_str(&keys::story(proxy, viewer, &key, &record, with_body).await);
            html(StatusCode::OK, page("Key", Some(viewer), Tab::Key, &main))
        }
        Ok(None) => {
            main.push_str("<p role=\"status\">No row for this client id and key: never seen, released, evicted or swept. A request with it now executes afresh.</p>");
            html(
                StatusCode::NOT_FOUND,
                page("Key", Some(viewer), Tab::Key, &main),
            )
        }
        Err(_) => store_down(viewer),
    }
}

/// A posted action: the confirmation, or — confirmed — the action itself.
async fn action<S: KeyStore + Inspect>(
    proxy: &Proxy<S>,
    viewer: &Viewer<'_>,
    session: &Session,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let form = match read_form(req, session).await {
        Ok(f) => f,
        Err(resp) => return resp,
    };
    let posted = actions::Posted::parse(&form);
    if posted.client.is_empty() || posted.key.is_empty() {
        return error_page(viewer, StatusCode::BAD_REQUEST, "The form names no key.");
    }
    let stored = crate::admin::resolve::stored_key(proxy, &posted.client, posted.key.clone()).await;
    if posted.confirm {
        return match actions::perform(proxy, viewer.who, &posted, &stored).await {
            Ok(main) => html(StatusCode::OK, page("Done", Some(viewer), Tab::None, &main)),
            Err(detail) => error_page(viewer, StatusCode::CONFLICT, &esc(&detail)),
        };
    }
    let record = match proxy.store().lookup(&posted.client, &stored).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            return error_page(
                viewer,
                StatusCode::NOT_FOUND,
                "No row for this client id and key (released, evicted or swept meanwhile).",
            );
        }
        Err(_) => return store_down(viewer),
    };
    match actions::confirm(proxy, viewer, &posted, &record) {
        Ok(main) => html(
            StatusCode::OK,
            page("Confirm", Some(viewer), Tab::None, &main),
        ),
        Err(detail) => error_page(viewer, StatusCode::BAD_REQUEST, &esc(&detail)),
    }
}

/// `POST /console/login`: the token from the form, exchanged for a session.
async fn login(tokens: &Tokens, console: &Console, req: Request<Incoming>) -> Response<ProxyBody> {
    let Ok(body) = Limited::new(req.into_body(), 16 << 10).collect().await else {
        return login_page(StatusCode::BAD_REQUEST, Some("The form could not be read."));
    };
    let body = body.to_bytes();
    let token = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let Some(who) = tokens.who(token.trim()) else {
        // The same answer, and about the same time, whatever was wrong with it.
        tokio::time::sleep(Duration::from_millis(250)).await;
        return login_page(
            StatusCode::UNAUTHORIZED,
            Some("That is not one of this proxy's admin tokens."),
        );
    };
    let Some(id) = console.sessions.open(who) else {
        return login_page(
            StatusCode::SERVICE_UNAVAILABLE,
            Some("No session could be started (no randomness); try again."),
        );
    };
    tracing::info!(operator = %who, "console: signed in");
    let mut resp = redirect("/");
    if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&id)) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

fn login_page(status: StatusCode, problem: Option<&str>) -> Response<ProxyBody> {
    let problem = problem
        .map(|p| {
            format!(
                "<p class=\"problem\" role=\"alert\" id=\"login-problem\">{}</p>",
                esc(p)
            )
        })
        .unwrap_or_default();
    let main = format!(
        "<p class=\"lede\">Enter an admin token (<code>admin_token</code>, <code>IDEMPROXY_ADMIN_TOKEN</code> or one of <code>admin_tokens</code>). \
         It is asked once per browser session and kept in no URL, no log and no page.</p>{problem}\
         <form class=\"login\" method=\"post\" action=\"/console/login\">\
         <label for=\"token\">Admin token</label><input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required autofocus>\
         <button type=\"submit\">Sign in</button></form>"
    );
    html(status, page("Sign in", None, Tab::None, &main))
}

/// A form post's fields, once its CSRF token is the session's.
async fn read_form(
    req: Request<Incoming>,
    session: &Session,
) -> Result<Vec<(String, String)>, Response<ProxyBody>> {
    let refused = |status, text: &str| {
        html(
            status,
            page("Refused", None, Tab::None, &format!("<p>{text}</p>")),
        )
    };
    let Ok(body) = Limited::new(req.into_body(), MAX_FORM).collect().await else {
        return Err(refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            "The form could not be read, or is larger than 1 MiB.",
        ));
    };
    let body: Bytes = body.to_bytes();
    let form: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
    let csrf = form
        .iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    if !super::auth::constant_eq(csrf.as_bytes(), session.csrf.as_bytes()) {
        return Err(refused(
            StatusCode::FORBIDDEN,
            "This form's token is not your session's: it was not sent from your console page. <a href=\"/\">Open the console again</a>.",
        ));
    }
    Ok(form)
}

fn store_down(viewer: &Viewer<'_>) -> Response<ProxyBody> {
    error_page(
        viewer,
        StatusCode::SERVICE_UNAVAILABLE,
        "The idempotency store cannot be reached; the cause is in the proxy's log.",
    )
}

/// `detail` is HTML already escaped.
fn error_page(viewer: &Viewer<'_>, status: StatusCode, detail: &str) -> Response<ProxyBody> {
    html(
        status,
        page(
            status.canonical_reason().unwrap_or("Error"),
            Some(viewer),
            Tab::None,
            &format!("<p class=\"problem\" role=\"alert\">{detail}</p>"),
        ),
    )
}

fn redirect(to: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = StatusCode::SEE_OTHER;
    resp.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    secure(resp)
}

fn html(status: StatusCode, body: String) -> Response<ProxyBody> {
    let mut resp = Response::new(full(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    secure(resp)
}

fn asset(content_type: &'static str, text: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(full(Bytes::from_static(text.as_bytes())));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    secure(resp)
}

/// The headers every console answer carries.
fn secure(mut resp: Response<ProxyBody>) -> Response<ProxyBody> {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}
