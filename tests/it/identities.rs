//! Identities that last (issue 56), end to end through the proxy to a counting upstream:
//! a tenant's renewed bearer JWTs, and its several API keys, are one key namespace (the
//! retry is replayed, executed once); another tenant's same key executes on its own; a
//! forged, expired or unlisted credential is a `401` that forwards nothing and never
//! reaches a stored answer.

use crate::support;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use sha2::{Digest, Sha256};
use support::*;

const SECRET: [u8; 32] = [42; 32];
const BODY: &str = r#"{"amount":100}"#;

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An HS256 JWT of `claims`, signed with `secret`.
fn jwt(claims: serde_json::Value, secret: &[u8]) -> String {
    let head = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT","kid":"h1"}"#);
    let body = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{head}.{body}");
    let sig = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, secret),
        signed.as_bytes(),
    );
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
}

async fn pay(client: &TestClient, auth: (&str, &str), key: &str) -> Reply {
    client
        .send(
            "POST",
            "/payments",
            &[
                auth,
                ("idempotency-key", key),
                ("content-type", "application/json"),
            ],
            BODY,
        )
        .await
}

/// Renewed tokens of one tenant replay its answer; another tenant's token is its own
/// namespace; a forged or expired token is refused before anything is reserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_jwts_share_a_namespace_and_forged_ones_are_refused() {
    let dir = TempDir::new("jwks");
    let jwks = dir.0.join("jwks.json");
    let k = URL_SAFE_NO_PAD.encode(SECRET);
    std::fs::write(
        &jwks,
        format!(r#"{{"keys": [{{"kty": "oct", "kid": "h1", "k": "{k}", "alg": "HS256"}}]}}"#),
    )
    .unwrap();
    let config = format!(
        "upstream:\n  url: {{upstream}}\n{{store}}\nclient_id:\n  jwt:\n    claim: sub\n    keys: {{ file: {} }}\n    audience: payments\nroutes:\n  - name: payments\n    path: /payments\n    require_key: true\n",
        jwks.display()
    );
    let upstream = Upstream::spawn(Behavior::default()).await;
    let db = Backend::embedded();
    let proxy = TestProxy::spawn(&config, &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let token = |sub: &str, issued: u64, secret: &[u8]| {
        let claims =
            serde_json::json!({"sub": sub, "aud": "payments", "iat": issued, "exp": issued + 3600});
        format!("Bearer {}", jwt(claims, secret))
    };
    let t = now();

    let first = pay(
        &client,
        ("authorization", &token("shop-1", t, &SECRET)),
        "k1",
    )
    .await;
    assert_eq!((first.status.as_u16(), first.replayed()), (201, false));
    // The SDK renewed its token: the same tenant, the same key → the first answer.
    let renewed = pay(
        &client,
        ("authorization", &token("shop-1", t + 1, &SECRET)),
        "k1",
    )
    .await;
    assert_eq!((renewed.status.as_u16(), renewed.replayed()), (201, true));
    assert_eq!(renewed.body, first.body);
    assert_eq!(upstream.executions(), 1);
    // Another tenant's same key is its own operation.
    let other = pay(
        &client,
        ("authorization", &token("shop-2", t, &SECRET)),
        "k1",
    )
    .await;
    assert_eq!((other.status.as_u16(), other.replayed()), (201, false));
    assert_eq!(upstream.executions(), 2);
    let keys: Vec<String> = upstream
        .seen()
        .iter()
        .map(|s| s.headers["idempotency-key"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, ["shop-1:k1", "shop-2:k1"]);

    // Forged (shop-1's claims under another secret), expired, not a JWT, another
    // audience, none at all: 401, nothing forwarded — and shop-1's stored answer is not
    // handed to any of them.
    let forged = token("shop-1", t, &[7; 32]);
    let expired = token("shop-1", t - 7200, &SECRET);
    let other_audience = format!(
        "Bearer {}",
        jwt(
            serde_json::json!({"sub": "shop-1", "aud": "billing", "exp": t + 60}),
            &SECRET
        )
    );
    for (auth, says) in [
        (forged.as_str(), "signature does not verify"),
        (expired.as_str(), "expired"),
        ("Bearer sk_live_opaque", "not a JWT"),
        ("Basic c2hvcDpzZWNyZXQ=", "Bearer"),
        (other_audience.as_str(), "audience"),
    ] {
        let refused = pay(&client, ("authorization", auth), "k1").await;
        assert_eq!(refused.status, 401, "{auth}");
        assert!(
            refused.is_problem() && refused.detail().contains(says),
            "{auth}: {}",
            refused.detail()
        );
        assert_ne!(refused.body, first.body);
    }
    let none = pay(&client, ("x-other", "1"), "k1").await;
    assert_eq!(none.status, 401);
    assert_eq!(upstream.executions(), 2, "nothing refused was forwarded");
    proxy.stop().await;
}

/// Two API keys named for one tenant share its keys; an unlisted key is refused, or —
/// with `unlisted: sha256` — gets a namespace of its own, never the tenant's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_of_one_tenant_share_a_namespace() {
    let hash = |v: &str| format!("sha256:{:x}", Sha256::digest(v.as_bytes()));
    let config = |unlisted: &str| {
        format!(
            "upstream:\n  url: {{upstream}}\n{{store}}\nclient_id:\n  credentials:\n    header: X-API-Key\n    unlisted: {unlisted}\n    tenants:\n      merchant-eu: [{}, {}]\n      merchant-us: [{}]\nroutes:\n  - name: payments\n    path: /payments\n    require_key: true\n",
            hash("key-old"),
            hash("key-new"),
            hash("key-us")
        )
    };
    let upstream = Upstream::spawn(Behavior::default()).await;
    let db = Backend::embedded();
    let proxy = TestProxy::spawn(&config("refuse"), &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let first = pay(&client, ("x-api-key", "key-old"), "k1").await;
    assert_eq!((first.status.as_u16(), first.replayed()), (201, false));
    // The key was rotated mid-retry: the new key's retry is the same operation.
    let rotated = pay(&client, ("x-api-key", "key-new"), "k1").await;
    assert_eq!((rotated.status.as_u16(), rotated.replayed()), (201, true));
    let us = pay(&client, ("x-api-key", "key-us"), "k1").await;
    assert_eq!((us.status.as_u16(), us.replayed()), (201, false));
    let stolen = pay(&client, ("x-api-key", "key-unknown"), "k1").await;
    assert_eq!(stolen.status, 401);
    assert!(
        stolen.detail().contains("client_id.credentials"),
        "{}",
        stolen.detail()
    );
    assert_eq!(upstream.executions(), 2);
    assert_eq!(
        upstream
            .seen()
            .iter()
            .map(|s| s.headers["idempotency-key"].to_str().unwrap().to_owned())
            .collect::<Vec<_>>(),
        ["merchant-eu:k1", "merchant-us:k1"]
    );
    proxy.stop().await;

    let upstream = Upstream::spawn(Behavior::default()).await;
    let db = Backend::embedded();
    let proxy = TestProxy::spawn(&config("sha256"), &upstream, &db).await;
    let client = TestClient::new(&proxy);
    let listed = pay(&client, ("x-api-key", "key-old"), "k1").await;
    let unlisted = pay(&client, ("x-api-key", "key-unknown"), "k1").await;
    assert_eq!((listed.status.as_u16(), listed.replayed()), (201, false));
    assert_eq!(
        (unlisted.status.as_u16(), unlisted.replayed()),
        (201, false)
    );
    let seen = upstream.seen();
    let derived = seen[1].headers["idempotency-key"].to_str().unwrap();
    // The namespace `authorization: sha256` would give it: the hash in hex.
    assert_eq!(derived, format!("{:x}:k1", Sha256::digest(b"key-unknown")));
    proxy.stop().await;
}
