//! `admin_token` and `admin_tokens:` — who may use the admin API and the console. Named
//! tokens are given by the SHA-256 of their value, so the file holds no secret and each
//! operator's actions are logged under a name.

use std::net::SocketAddr;

use super::Problems;
use crate::config::file::FileAdminToken;
use crate::config::model::AdminToken;

/// The name `admin_token` (or `IDEMPROXY_ADMIN_TOKEN`) is logged under.
pub const UNNAMED_TOKEN: &str = "admin";

/// The plain token and the named ones; a listener that is not loopback needs one of them.
pub(super) fn build_admin_tokens(
    p: &mut Problems,
    admin_listen: Option<SocketAddr>,
    admin_token: Option<&str>,
    named: Option<&[FileAdminToken]>,
) -> Vec<AdminToken> {
    let mut tokens: Vec<AdminToken> = Vec::new();
    for (i, t) in named.unwrap_or_default().iter().enumerate() {
        let at = format!("admin_tokens[{i}]");
        let name_ok = !t.name.is_empty()
            && t.name.len() <= 64
            && t.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b));
        if !name_ok {
            p.push(
                format!("{at}.name"),
                format!(
                    "`{}` is not a token name: 1–64 letters, digits, `.`, `_`, `-` or `@` (it names the operator in audit lines)",
                    t.name.escape_debug()
                ),
            );
            continue;
        }
        if t.name == UNNAMED_TOKEN && admin_token.is_some() {
            p.push(
                format!("{at}.name"),
                "`admin` is the name of admin_token (IDEMPROXY_ADMIN_TOKEN); choose another",
            );
            continue;
        }
        if tokens.iter().any(|o| o.name == t.name) {
            p.push(format!("{at}.name"), format!("`{}` is named twice", t.name));
            continue;
        }
        let Some(sha256) = crate::key::from_hex::<32>(&t.sha256) else {
            p.push(
                format!("{at}.sha256"),
                "must be the token's SHA-256 in hex, 64 characters (`printf %s \"$TOKEN\" | sha256sum`)",
            );
            continue;
        };
        tokens.push(AdminToken {
            name: t.name.clone(),
            sha256,
        });
    }
    if let Some(addr) = admin_listen
        && !addr.ip().is_loopback()
        && admin_token.is_none()
        && named.is_none_or(<[_]>::is_empty)
    {
        p.push(
            "admin_token",
            format!("required when admin_listen ({addr}) is not a loopback address; set it, IDEMPROXY_ADMIN_TOKEN or admin_tokens"),
        );
    }
    tokens
}
