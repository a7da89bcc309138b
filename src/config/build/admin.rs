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

#[cfg(test)]
mod tests {
    use crate::config::{Overrides, load_str};

    const UP: &str = "upstream:\n  url: http://127.0.0.1:3000\n";
    const ALICE: &str = "2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90";

    fn errors(yaml: &str) -> String {
        match load_str(&format!("{UP}{yaml}"), &Overrides::default()) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    /// Named tokens are checked, each mistake under its key; one of them is enough for a
    /// listener that is not loopback.
    #[test]
    fn named_tokens_are_checked() {
        let ok = load_str(
            &format!("{UP}admin_listen: 0.0.0.0:9090\nadmin_tokens:\n  - name: alice\n    sha256: {ALICE}\n"),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(ok.admin_tokens[0].name, "alice");
        assert_eq!(ok.admin_tokens[0].sha256[0], 0x2b);
        let e = errors("admin_listen: 0.0.0.0:9090\n");
        assert!(e.contains("admin_token: required when admin_listen"), "{e}");
        let e = errors("admin_tokens:\n  - name: al ice\n    sha256: zz\n");
        assert!(e.contains("admin_tokens[0].name"), "{e}");
        let e = errors("admin_tokens:\n  - name: bob\n    sha256: zz\n");
        assert!(
            e.contains("admin_tokens[0].sha256: must be the token's SHA-256"),
            "{e}"
        );
        let e = errors(&format!(
            "admin_tokens:\n  - name: bob\n    sha256: {ALICE}\n  - name: bob\n    sha256: {ALICE}\n"
        ));
        assert!(
            e.contains("admin_tokens[1].name: `bob` is named twice"),
            "{e}"
        );
        let e = errors(&format!(
            "admin_token: x\nadmin_tokens:\n  - name: admin\n    sha256: {ALICE}\n"
        ));
        assert!(
            e.contains("admin_tokens[0].name: `admin` is the name of admin_token"),
            "{e}"
        );
        let e = errors("admin_tokens:\n  - name: bob\n");
        assert!(e.contains("sha256"), "a missing hash is named: {e}");
    }
}
