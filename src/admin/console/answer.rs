//! How the console answers: pages with the headers every console answer carries (a strict
//! Content-Security-Policy, no framing, no caching), and refusals — an HTML page for a
//! browser, `application/problem+json` for anything else (a script, curl), as every error
//! the proxy produces.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

use super::html::{Tab, Viewer, esc, page};
use crate::body::{ProxyBody, full};
use crate::problem::Problem;

/// The page's rules: nothing but this origin's own script and style, no frames, no plugins,
/// forms only to this origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
    connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Whether the request is a browser's navigation (it accepts HTML), which gets pages;
/// anything else gets problem documents.
pub(super) fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/html"))
}

/// What the console refuses, said once for both forms.
pub(super) struct Refusal {
    pub status: StatusCode,
    /// The problem type's last part (`urn:idemproxy:problem:{kind}`).
    pub kind: &'static str,
    pub title: &'static str,
    /// Plain text.
    pub detail: String,
    /// Where to go from here, for the page: (href, label).
    pub next: Option<(&'static str, &'static str)>,
    /// `Allow`, for `405`.
    pub allow: Option<&'static str>,
}

impl Refusal {
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Refusal {
            status,
            kind,
            title,
            detail: detail.into(),
            next: None,
            allow: None,
        }
    }

    pub fn then(self, href: &'static str, label: &'static str) -> Self {
        Refusal {
            next: Some((href, label)),
            ..self
        }
    }

    /// The answer: a page for a browser (`html`), a problem document otherwise.
    pub fn answer(self, html: bool, viewer: Option<&Viewer<'_>>) -> Response<ProxyBody> {
        let mut resp = if html {
            let next = self
                .next
                .map(|(href, label)| format!(" <a href=\"{href}\">{label}</a>."))
                .unwrap_or_default();
            let main = format!(
                "<p class=\"problem\" role=\"alert\">{}{next}</p>",
                esc(&self.detail)
            );
            page_answer(self.status, page(self.title, viewer, Tab::None, &main))
        } else {
            let problem = Problem::new(self.status, self.kind, self.title, self.detail);
            let mut resp = Response::new(full(serde_json::to_vec(&problem).unwrap_or_default()));
            *resp.status_mut() = self.status;
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/problem+json"),
            );
            secure(resp)
        };
        if let Some(allow) = self.allow {
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        resp
    }
}

/// `405` naming the methods the address takes.
pub(super) fn not_allowed(allow: &'static str) -> Refusal {
    Refusal {
        allow: Some(allow),
        ..Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            format!("This address takes {allow}."),
        )
    }
}

/// The store did not answer.
pub(super) fn store_down() -> Refusal {
    Refusal::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "store-unavailable",
        "Store unavailable",
        "The idempotency store cannot be reached; the cause is in the proxy's log.",
    )
}

/// A page.
pub(super) fn page_answer(status: StatusCode, body: String) -> Response<ProxyBody> {
    let mut resp = Response::new(full(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    secure(resp)
}

/// JSON for the overview's script.
pub(super) fn json(value: &impl serde::Serialize) -> Response<ProxyBody> {
    let mut resp = Response::new(full(serde_json::to_vec(value).unwrap_or_default()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    secure(resp)
}

/// One of the compiled-in assets.
pub(super) fn asset(content_type: &'static str, text: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(full(Bytes::from_static(text.as_bytes())));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    secure(resp)
}

/// `303` to `to`, setting `cookie` when given.
pub(super) fn redirect(to: &'static str, cookie: Option<String>) -> Response<ProxyBody> {
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = StatusCode::SEE_OTHER;
    resp.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    if let Some(v) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
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
    // Not `no-referrer`: with it, browsers send `Origin: null` on the console's own form
    // posts, which the origin check refuses.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}
