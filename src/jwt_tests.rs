//! Tokens signed here with each algorithm, then bent: every check must refuse its own
//! kind of bad token, and a good one must give its claim.

use super::*;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair, RsaKeyPair};
use serde_json::json;

const NOW: u64 = 1_800_000_000;
const SECRET: &[u8] = b"a shared secret of at least thirty-two bytes";
/// A test-only RSA key in PKCS#8 (`openssl genpkey -algorithm RSA`, then `openssl pkcs8
/// -topk8 -nocrypt -outform DER`).
const RSA_PKCS8: &[u8] = include_bytes!("../tests/fixtures/jwt-rsa-2048.pk8");

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn claims(extra: Value) -> Value {
    let mut c = json!({"sub": "merchant-7", "exp": NOW + 3600, "iss": "https://auth.example", "aud": ["payments", "other"]});
    if let (Value::Object(c), Value::Object(extra)) = (&mut c, extra) {
        c.extend(extra);
    }
    c
}

/// Signs `header.claims` with `sign`.
fn token(header: Value, claims: &Value, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
    let signed = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let sig = sign(signed.as_bytes());
    format!("{signed}.{}", b64(&sig))
}

fn hs256(msg: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, SECRET), msg)
        .as_ref()
        .to_vec()
}

fn rsa() -> RsaKeyPair {
    RsaKeyPair::from_pkcs8(RSA_PKCS8).unwrap()
}

fn rs256(msg: &[u8]) -> Vec<u8> {
    let key = rsa();
    let mut sig = vec![0; key.public().modulus_len()];
    key.sign(
        &signature::RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        msg,
        &mut sig,
    )
    .unwrap();
    sig
}

/// The RSA key's public modulus and exponent.
fn rsa_public() -> signature::RsaPublicKeyComponents<Vec<u8>> {
    rsa().public().into()
}

fn jwks(ec: &EcdsaKeyPair) -> String {
    let rsa = rsa_public();
    let point = ec.public_key().as_ref();
    json!({"keys": [
        {"kty": "oct", "kid": "h1", "k": b64(SECRET), "alg": "HS256"},
        {"kty": "RSA", "kid": "r1", "use": "sig",
         "n": b64(&rsa.n), "e": b64(&rsa.e)},
        {"kty": "EC", "crv": "P-256", "kid": "e1", "x": b64(&point[1..33]), "y": b64(&point[33..])},
    ]})
    .to_string()
}

fn ec_key() -> EcdsaKeyPair {
    let rng = SystemRandom::new();
    let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref(), &rng).unwrap()
}

fn verifier(ec: &EcdsaKeyPair) -> Verifier {
    Verifier::from_jwks(
        &jwks(ec),
        "sub".into(),
        Some("https://auth.example".into()),
        Some("payments".into()),
        Duration::from_secs(60),
    )
    .unwrap()
}

/// Each algorithm's good token gives its claim; with or without a `kid`.
#[test]
fn good_tokens_give_their_claim() {
    let ec = ec_key();
    let v = verifier(&ec);
    let c = claims(json!({}));
    let es256 = |msg: &[u8]| {
        ec.sign(&SystemRandom::new(), msg)
            .unwrap()
            .as_ref()
            .to_vec()
    };
    for t in [
        token(json!({"alg": "HS256", "typ": "JWT"}), &c, hs256),
        token(json!({"alg": "HS256", "kid": "h1"}), &c, hs256),
        token(json!({"alg": "RS256", "kid": "r1"}), &c, rs256),
        token(json!({"alg": "RS256"}), &c, rs256),
        token(json!({"alg": "ES256", "kid": "e1"}), &c, es256),
    ] {
        assert_eq!(v.identity(&t, NOW).as_deref(), Ok("merchant-7"), "{t}");
    }
    // A renewed token (new expiry, new issue time) is the same identity.
    let renewed = claims(json!({"exp": NOW + 7200, "iat": NOW}));
    let t = token(json!({"alg": "RS256"}), &renewed, rs256);
    assert_eq!(v.identity(&t, NOW).as_deref(), Ok("merchant-7"));
    // A whole-number claim is its decimal text.
    let numeric = Verifier {
        claim: "tenant".into(),
        ..v.clone()
    };
    let t = token(
        json!({"alg": "HS256"}),
        &claims(json!({"tenant": 42})),
        hs256,
    );
    assert_eq!(numeric.identity(&t, NOW).as_deref(), Ok("42"));
}

/// A forged, bent, expired or misdirected token is refused, each with its reason.
#[test]
fn bad_tokens_are_refused() {
    let ec = ec_key();
    let v = verifier(&ec);
    let c = claims(json!({}));
    let good = token(json!({"alg": "HS256"}), &c, hs256);
    let (head, rest) = good.split_once('.').unwrap();
    let (_, sig) = rest.split_once('.').unwrap();
    // Another tenant's claims under the first token's signature.
    let forged_claims = b64(claims(json!({"sub": "merchant-8"})).to_string().as_bytes());
    let forged = format!("{head}.{forged_claims}.{sig}");
    let cases: Vec<(String, &str)> = vec![
        (forged, "does not verify"),
        (
            token(json!({"alg": "HS256"}), &c, |m| {
                hmac::sign(
                    &hmac::Key::new(hmac::HMAC_SHA256, b"another secret of thirty-two bytes!"),
                    m,
                )
                .as_ref()
                .to_vec()
            }),
            "does not verify",
        ),
        (token(json!({"alg": "none"}), &c, |_| Vec::new()), "no key"),
        // The RSA public key used as an HMAC secret (the classic confusion) is not a key.
        (
            token(json!({"alg": "HS256", "kid": "r1"}), &c, |m| {
                let n = rsa_public().n;
                hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &n), m)
                    .as_ref()
                    .to_vec()
            }),
            "no key",
        ),
        (
            token(json!({"alg": "RS256", "kid": "r9"}), &c, rs256),
            "kid `r9`",
        ),
        (
            token(json!({"alg": "HS256", "crit": ["x"]}), &c, hs256),
            "crit",
        ),
        (
            token(
                json!({"alg": "HS256"}),
                &claims(json!({"exp": NOW - 61})),
                hs256,
            ),
            "expired",
        ),
        (
            token(
                json!({"alg": "HS256"}),
                &claims(json!({"nbf": NOW + 61})),
                hs256,
            ),
            "not valid yet",
        ),
        (
            token(
                json!({"alg": "HS256"}),
                &json!({"sub": "m", "iss": "https://auth.example", "aud": "payments"}),
                hs256,
            ),
            "no `exp`",
        ),
        (
            token(
                json!({"alg": "HS256"}),
                &claims(json!({"iss": "https://evil.example"})),
                hs256,
            ),
            "issuer",
        ),
        (
            token(
                json!({"alg": "HS256"}),
                &claims(json!({"aud": "billing"})),
                hs256,
            ),
            "audience",
        ),
        (
            token(
                json!({"alg": "HS256"}),
                &claims(json!({"sub": null})),
                hs256,
            ),
            "no `sub` claim",
        ),
        (
            token(
                json!({"alg": "HS256"}),
                &claims(json!({"sub": "a\u{7}b"})),
                hs256,
            ),
            "printable",
        ),
        ("not-a-jwt".into(), "three base64url parts"),
        ("a.b.c.d".into(), "three base64url parts"),
        ("%%.e30.AA".into(), "header is not base64url"),
        (
            format!("{}.e30.AA", b64(b"[1]")),
            "header is not a JSON object",
        ),
        ("x".repeat(MAX_TOKEN + 1), "over"),
    ];
    for (t, says) in cases {
        let e = v.identity(&t, NOW).unwrap_err();
        assert!(e.contains(says), "{says}: {e}");
    }
    // Within the leeway, an expiry a little past is still accepted.
    let t = token(
        json!({"alg": "HS256"}),
        &claims(json!({"exp": NOW - 30})),
        hs256,
    );
    assert!(v.identity(&t, NOW).is_ok());
}

/// A JWKS the proxy could not check with is refused at start, naming the key.
#[test]
fn unusable_keys_are_refused() {
    let load = |keys: Value| {
        Verifier::from_jwks(
            &json!({"keys": keys}).to_string(),
            "sub".into(),
            None,
            None,
            Duration::ZERO,
        )
    };
    for (keys, says) in [
        (json!([]), "no `keys`"),
        (
            json!([{"kty": "oct", "k": b64(b"short")}]),
            "at least 32 bytes",
        ),
        (
            json!([{"kty": "RSA", "n": b64(&[7; 128]), "e": "AQAB"}]),
            "under 2048",
        ),
        (
            json!([{"kty": "EC", "crv": "P-384", "x": "AA", "y": "AA"}]),
            "`crv: P-384`",
        ),
        (
            json!([{"kty": "OKP", "crv": "Ed25519", "x": "AA"}]),
            "`kty: OKP`",
        ),
        (
            json!([{"kty": "oct", "k": b64(SECRET), "use": "enc"}]),
            "`use: enc`",
        ),
        (
            json!([{"kty": "oct", "k": b64(SECRET), "alg": "HS512"}]),
            "`alg: HS512`",
        ),
        (json!([{"kty": "RSA", "e": "AQAB"}]), "`n` is missing"),
        (json!([{"k": "x"}]), "`kty` is missing"),
    ] {
        let e = load(keys).unwrap_err();
        assert!(e.contains("keys") && e.contains(says), "{says}: {e}");
    }
    assert!(Verifier::from_jwks("{", "sub".into(), None, None, Duration::ZERO).is_err());
    // Debug names keys, never a secret.
    let v = load(json!([{"kty": "oct", "kid": "h1", "k": b64(SECRET)}])).unwrap();
    let shown = format!("{v:?}");
    assert!(
        shown.contains("h1 (HS256)") && !shown.contains(&b64(SECRET)),
        "{shown}"
    );
}
