//! Signing in and out, and reading a session's form posts: the token is taken from a
//! posted form only (never a URL), exchanged for a session, and every later post must
//! carry that session's CSRF token.

use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use super::answer::{Refusal, page_answer, redirect};
use super::html::{Tab, esc, page};
use super::session::{self, Session};
use super::{Console, MAX_FORM};
use crate::admin::auth::{Tokens, constant_eq};
use crate::body::ProxyBody;

/// `POST /console/login`: the token from the form, exchanged for a session.
pub(super) async fn login(
    tokens: &Tokens,
    console: &Console,
    html: bool,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let refused = |status, kind, title, detail: &str| {
        if html {
            login_page(status, Some(detail))
        } else {
            Refusal::new(status, kind, title, detail).answer(false, None)
        }
    };
    let Ok(body) = Limited::new(req.into_body(), 16 << 10).collect().await else {
        return refused(
            StatusCode::BAD_REQUEST,
            "bad-form",
            "Invalid form",
            "The form could not be read, or is larger than 16 KiB.",
        );
    };
    let body = body.to_bytes();
    let token = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let Some(who) = tokens.who(token.trim()) else {
        // The same answer, and about the same time, whatever was wrong with it.
        tokio::time::sleep(Duration::from_millis(250)).await;
        return refused(
            StatusCode::UNAUTHORIZED,
            "admin-unauthorized",
            "Admin token required",
            "That is not one of this proxy's admin tokens.",
        );
    };
    let Some(id) = console.sessions.open(who) else {
        return refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "no-session",
            "No session",
            "No session could be started (no randomness); try again.",
        );
    };
    tracing::info!(operator = %who, "console: signed in");
    redirect("/", Some(session::set_cookie(&id)))
}

/// `POST /console/logout`: ends the session (its form must carry its CSRF token).
pub(super) async fn logout(
    console: &Console,
    id: &str,
    session: &Session,
    html: bool,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    if let Err(refusal) = read_form(req, session).await {
        return refusal.answer(html, None);
    }
    console.sessions.close(id);
    redirect("/", Some(session::clear_cookie()))
}

/// The sign-in page, with what was wrong with the last try.
pub(super) fn login_page(status: StatusCode, problem: Option<&str>) -> Response<ProxyBody> {
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
    page_answer(status, page("Sign in", None, Tab::None, &main))
}

/// A form post's fields, once its CSRF token is the session's.
pub(super) async fn read_form(
    req: Request<Incoming>,
    session: &Session,
) -> Result<Vec<(String, String)>, Refusal> {
    let Ok(body) = Limited::new(req.into_body(), MAX_FORM).collect().await else {
        return Err(Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "bad-form",
            "Invalid form",
            "The form could not be read, or is larger than 1 MiB.",
        ));
    };
    let body = body.to_bytes();
    let form: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
    let csrf = form
        .iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    if !constant_eq(csrf.as_bytes(), session.csrf.as_bytes()) {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "csrf-token-mismatch",
            "Not sent from your console",
            "This form's token is not your session's: it was not sent from your console page.",
        )
        .then("/", "Open the console again"));
    }
    Ok(form)
}
