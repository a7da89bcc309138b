//! `client_id:` as the loader reads it: the credential → tenant map, verified JWT claims,
//! and the warning where an identity would rotate under a route's API.

use super::tests::{UP, err};
use super::*;
use crate::config::ClientIdSource;

/// `client_id.credentials` names tenants by their credentials' hashes (two keys of one
/// tenant, one namespace), prints back as it was given, and refuses what cannot work: a
/// malformed hash, a credential under two tenants, no tenants, an unknown `unlisted`.
#[test]
fn credentials_name_tenants() {
    let a = format!("sha256:{}", "ab".repeat(32));
    let b = format!("sha256:{}", "CD".repeat(32));
    let c = load_str(
        &format!(
            "{UP}client_id:\n  credentials:\n    header: X-API-Key\n    tenants:\n      shop-1: [{a}, {b}]\n      shop-2: [sha256:{}]\n",
            "01".repeat(32)
        ),
        &Overrides::default(),
    )
    .unwrap();
    let ClientIdSource::Credentials(creds) = &c.client_id else {
        panic!("{:?}", c.client_id)
    };
    assert_eq!(creds.header, "x-api-key");
    assert_eq!(creds.tenants.len(), 3);
    assert_eq!(creds.tenants[&[0xab; 32]], "shop-1");
    assert_eq!(creds.tenants[&[0xcd; 32]], "shop-1");
    assert!(!creds.unlisted_own_namespace);
    let printed = c.to_string();
    assert!(
        printed.contains(&format!("\"shop-1\": [{a}, {}]", b.to_lowercase()))
            && printed.contains("unlisted: refuse"),
        "{printed}"
    );
    // What check-config prints loads again to the same source.
    let again = load_str(&printed, &Overrides::default()).unwrap();
    assert_eq!(again.client_id, c.client_id);

    for (section, key, says) in [
        (
            "credentials:\n    tenants:\n      shop-1: [sha256:abc]\n",
            "client_id.credentials.tenants.shop-1[0]",
            "64 hex digits",
        ),
        (
            "credentials:\n    tenants:\n      shop-1: [bearer-sk-live]\n",
            "client_id.credentials.tenants.shop-1[0]",
            "no secret",
        ),
        (
            &format!("credentials:\n    tenants:\n      shop-1: [{a}]\n      shop-2: [{a}]\n"),
            "client_id.credentials.tenants.shop-2[0]",
            "listed for `shop-1` too",
        ),
        (
            "credentials:\n    tenants: {}\n",
            "client_id.credentials.tenants",
            "at least one tenant",
        ),
        (
            &format!(
                "credentials:\n    tenants:\n      {}: [{a}]\n",
                "0f".repeat(32)
            ),
            "client_id.credentials.tenants.0f0f",
            "name the tenant otherwise",
        ),
        (
            &format!("credentials:\n    unlisted: allow\n    tenants:\n      shop-1: [{a}]\n"),
            "client_id.credentials.unlisted",
            "`allow`",
        ),
        (
            &format!("credentials:\n    header: Connection\n    tenants:\n      shop-1: [{a}]\n"),
            "client_id.credentials.header",
            "hop-by-hop",
        ),
        (
            &format!("static: shop\n  credentials:\n    tenants:\n      shop-1: [{a}]\n"),
            "client_id",
            "exactly one",
        ),
    ] {
        let e = err(&format!("{UP}client_id:\n  {section}"));
        assert!(e.contains(key) && e.contains(says), "{section}: {e}");
    }
}

/// A PayPal route with the identity taken from `Authorization` (whose OAuth tokens renew)
/// is warned about, naming the route; a gateway's header, or a Stripe route, is quiet.
#[test]
fn rotating_identities_are_warned_about() {
    let warnings = |client_id: &str, route: &str| {
        load_str(
            &format!("{UP}client_id:\n  {client_id}\nroutes:\n  - name: orders\n    path: /v2/checkout/orders\n    {route}\n"),
            &Overrides::default(),
        )
        .unwrap()
        .warnings
        .into_iter()
        .filter(|w| w.contains("OAuth"))
        .collect::<Vec<_>>()
    };
    for route in [
        "errors: paypal",
        "upstream_key_header: PayPal-Request-Id",
        "key_header: PayPal-Request-Id",
    ] {
        let w = warnings("authorization: sha256", route);
        assert!(
            w.len() == 1 && w[0].contains("routes `orders`") && w[0].contains("header"),
            "{route}: {w:?}"
        );
    }
    assert!(warnings("header: X-Tenant", "errors: paypal").is_empty());
    assert!(warnings("static: shop", "errors: paypal").is_empty());
    assert!(warnings("authorization: sha256", "errors: stripe").is_empty());
}

/// `client_id.jwt` reads its JWKS at start (from the environment or a file, never inline),
/// prints back loadable, and refuses keys it could not check a token with.
#[test]
fn jwt_identities_are_configured_and_checked() {
    use base64::Engine;
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([7u8; 32]);
    let jwks = format!(r#"{{"keys": [{{"kty": "oct", "kid": "h1", "k": "{secret}"}}]}}"#);
    let env = |jwks: &str| Overrides {
        env: Some([("JWKS".to_owned(), jwks.to_owned())].into()),
        ..Overrides::default()
    };
    let text = format!(
        "{UP}client_id:\n  jwt:\n    claim: tenant_id\n    keys: {{ env: JWKS }}\n    issuer: https://auth.example\n    leeway: 30s\n"
    );
    let c = load_str(&text, &env(&jwks)).unwrap();
    let ClientIdSource::Jwt(j) = &c.client_id else {
        panic!("{:?}", c.client_id)
    };
    assert_eq!(j.verifier.claim(), "tenant_id");
    assert_eq!(j.verifier.leeway(), std::time::Duration::from_secs(30));
    let printed = c.to_string();
    assert!(
        printed.contains("keys: { env: \"JWKS\" }   # h1 (HS256)")
            && printed.contains("issuer: \"https://auth.example\"")
            && !printed.contains(&secret),
        "{printed}"
    );
    let again = load_str(&printed, &env(&jwks)).unwrap();
    assert_eq!(again.client_id, c.client_id);
    // A JWT's claim does not rotate with the token: no warning on a PayPal route.
    let paypal = format!("{text}routes:\n  - name: orders\n    path: /o\n    errors: paypal\n");
    let warnings = load_str(&paypal, &env(&jwks)).unwrap().warnings;
    assert!(
        !warnings.iter().any(|w| w.contains("OAuth")),
        "{warnings:?}"
    );

    for (section, jwks, says) in [
        ("jwt: {}\n", "", "client_id.jwt.keys: required"),
        (
            "jwt:\n    keys: inline\n",
            "",
            "never written in the configuration",
        ),
        (
            "jwt:\n    keys: { env: JWKS }\n",
            "{\"keys\": []}",
            "no `keys`",
        ),
        (
            "jwt:\n    keys: { env: JWKS }\n",
            "{\"keys\": [{\"kty\": \"oct\", \"k\": \"c2hvcnQ\"}]}",
            "keys[0]: an HS256 secret",
        ),
        ("jwt:\n    keys: { env: NOPE }\n", "", "NOPE is not set"),
        (
            "jwt:\n    claim: ''\n    keys: { env: JWKS }\n",
            &jwks,
            "client_id.jwt.claim",
        ),
        (
            "jwt:\n    audience: ''\n    keys: { env: JWKS }\n",
            &jwks,
            "leave them out",
        ),
    ] {
        let e = load_str(&format!("{UP}client_id:\n  {section}"), &env(jwks))
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{section}: {e}");
    }
}
