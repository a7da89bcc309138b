//! The console's sessions: a token entered once is exchanged for a random session id in an
//! `HttpOnly`, `SameSite=Strict` cookie that ends with the browser session, so the token
//! never travels again, never sits in a URL and is never logged. Each session carries its
//! own CSRF token, which every form posts back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use http::{HeaderMap, header};
use ring::rand::{SecureRandom, SystemRandom};

/// The cookie's name.
pub(super) const COOKIE: &str = "idemproxy_console";

/// A session unused this long ends.
const IDLE: Duration = Duration::from_secs(30 * 60);

/// A session ends this long after the token was entered, used or not.
const MAX_AGE: Duration = Duration::from_secs(12 * 3600);

/// Most sessions held; the oldest goes first.
const MAX_SESSIONS: usize = 256;

/// One logged-in browser.
#[derive(Clone)]
pub(super) struct Session {
    /// The token's name: who the audit lines name.
    pub who: String,
    /// Posted back by every form of this session.
    pub csrf: String,
    created: Instant,
    seen: Instant,
}

/// The sessions of this admin listener (in memory: each replica has its own).
pub(super) struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
    rng: SystemRandom,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions {
            by_id: Mutex::default(),
            rng: SystemRandom::new(),
        }
    }
}

impl Sessions {
    /// A new session for `who`: its id (for the cookie).
    pub fn open(&self, who: &str) -> Option<String> {
        let id = random(&self.rng)?;
        let csrf = random(&self.rng)?;
        let now = Instant::now();
        let mut map = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, s| alive(s, now));
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.created)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            id.clone(),
            Session {
                who: who.to_owned(),
                csrf,
                created: now,
                seen: now,
            },
        );
        Some(id)
    }

    /// The live session the request's cookie names, marked as used.
    pub fn find(&self, headers: &HeaderMap) -> Option<(String, Session)> {
        let id = cookie(headers)?;
        let now = Instant::now();
        let mut map = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        let session = map.get_mut(id)?;
        if !alive(session, now) {
            map.remove(id);
            return None;
        }
        session.seen = now;
        Some((id.to_owned(), session.clone()))
    }

    /// Ends a session.
    pub fn close(&self, id: &str) {
        let mut map = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(id);
    }
}

fn alive(s: &Session, now: Instant) -> bool {
    now.duration_since(s.seen) < IDLE && now.duration_since(s.created) < MAX_AGE
}

/// 32 random bytes, base64url.
fn random(rng: &SystemRandom) -> Option<String> {
    let mut bytes = [0u8; 32];
    rng.fill(&mut bytes).ok()?;
    Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The session id in the request's `Cookie` headers.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE).then_some(value)
        })
}

/// The `Set-Cookie` value that starts a session: no `Max-Age`, so it ends with the browser
/// session; `HttpOnly` keeps it from scripts, `SameSite=Strict` from other sites' requests.
pub(super) fn set_cookie(id: &str) -> String {
    format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict")
}

/// The `Set-Cookie` value that ends one.
pub(super) fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// Whether a state-changing request comes from the console's own pages: a browser says
/// where a request comes from (`Sec-Fetch-Site`, `Origin`); a request another site makes
/// it send is refused even before its CSRF token is checked.
pub(super) fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return false;
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    match (origin.to_str().ok(), host) {
        (Some(origin), Some(host)) => {
            origin.strip_prefix("http://") == Some(host)
                || origin.strip_prefix("https://") == Some(host)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    /// A session is found by its cookie among others, and not after it is closed.
    #[test]
    fn sessions_by_cookie() {
        let s = Sessions::default();
        let id = s.open("alice").unwrap();
        let h = headers(&[("cookie", &format!("a=b; {COOKIE}={id}; c=d"))]);
        let (found, session) = s.find(&h).unwrap();
        assert_eq!(
            (found.as_str(), session.who.as_str()),
            (id.as_str(), "alice")
        );
        assert_ne!(session.csrf, id);
        assert!(
            s.find(&headers(&[("cookie", &format!("{COOKIE}=x"))]))
                .is_none()
        );
        s.close(&id);
        assert!(s.find(&h).is_none());
    }

    /// Cross-site requests are refused; same-origin and origin-less ones pass.
    #[test]
    fn cross_site_requests_are_told_apart() {
        let host = ("host", "127.0.0.1:9090");
        assert!(same_origin(&headers(&[host])));
        assert!(same_origin(&headers(&[
            host,
            ("origin", "http://127.0.0.1:9090")
        ])));
        assert!(same_origin(&headers(&[
            host,
            ("sec-fetch-site", "same-origin")
        ])));
        assert!(!same_origin(&headers(&[
            host,
            ("origin", "https://evil.example")
        ])));
        assert!(!same_origin(&headers(&[host, ("origin", "null")])));
        assert!(!same_origin(&headers(&[
            host,
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(!same_origin(&headers(&[
            host,
            ("sec-fetch-site", "same-site")
        ])));
    }
}
