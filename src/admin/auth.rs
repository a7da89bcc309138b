//! Who may use the admin API and the console: `admin_token` (named `admin`) and the named
//! `admin_tokens:` (kept as SHA-256). Every comparison is constant-time, and what an action
//! logs is the token's name, never the token.

use http::{HeaderMap, header};
use sha2::{Digest, Sha256};

use crate::config::{AdminToken, Config, UNNAMED_TOKEN};

/// The tokens this listener accepts.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    plain: Option<String>,
    named: Vec<AdminToken>,
}

impl Tokens {
    /// The tokens `config` names.
    pub fn from_config(config: &Config) -> Self {
        Tokens {
            plain: config.admin_token.clone(),
            named: config.admin_tokens.clone(),
        }
    }

    /// Whether any token is configured: without one, the admin API is open (the listener
    /// is loopback) and the console is closed.
    pub fn any(&self) -> bool {
        self.plain.is_some() || !self.named.is_empty()
    }

    /// The name of the token `presented` is, if it is one.
    pub fn who(&self, presented: &str) -> Option<&str> {
        let mut found = None;
        // Every token is compared, matched or not, so the time taken says nothing.
        if let Some(plain) = &self.plain
            && constant_eq(presented.as_bytes(), plain.as_bytes())
        {
            found = Some(UNNAMED_TOKEN);
        }
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        for t in &self.named {
            if constant_eq(&digest, &t.sha256) {
                found = Some(t.name.as_str());
            }
        }
        found
    }

    /// Who sent `headers`' `Authorization: Bearer …`: `Ok(None)` when no token is
    /// configured (anyone on the loopback listener), `Err(Refused)` for a missing or wrong
    /// one.
    pub fn bearer_of(&self, headers: &HeaderMap) -> Result<Option<&str>, Refused> {
        if !self.any() {
            return Ok(None);
        }
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
            .unwrap_or_default();
        self.who(given).map(Some).ok_or(Refused)
    }
}

/// No token, or not one of ours.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused;

/// The credentials of a `Bearer` authorization; the scheme is case-insensitive (RFC 9110
/// §11.1), and spaces around the token are not part of it.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Byte equality whose time depends on the lengths only.
pub(super) fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        Tokens {
            plain: Some("plain-secret".into()),
            named: vec![AdminToken {
                name: "alice".into(),
                sha256: Sha256::digest(b"alice-secret").into(),
            }],
        }
    }

    /// Each token is known by its name; anything else by none.
    #[test]
    fn tokens_are_known_by_name() {
        let t = tokens();
        assert_eq!(t.who("plain-secret"), Some("admin"));
        assert_eq!(t.who("alice-secret"), Some("alice"));
        assert_eq!(t.who("alice-secret "), None);
        assert_eq!(t.who(""), None);
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            "bEaReR  alice-secret ".parse().unwrap(),
        );
        assert_eq!(t.bearer_of(&h), Ok(Some("alice")));
        h.insert(header::AUTHORIZATION, "Basic alice-secret".parse().unwrap());
        assert_eq!(t.bearer_of(&h), Err(Refused));
        assert_eq!(Tokens::default().bearer_of(&h), Ok(None));
    }
}
