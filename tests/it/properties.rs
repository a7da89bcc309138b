//! Properties of every parser and canonicaliser, over generated inputs.

use http::{HeaderMap, HeaderName, HeaderValue};
use idemproxy::config::Lookup;
use idemproxy::config::{Overrides, load_str};
use idemproxy::fingerprint::{self, fingerprint};
use idemproxy::path::normalize;
use idemproxy::proxy::{body_key, parse_key};
use idemproxy::route::PathPattern;
use idemproxy::stored::decode_stored;
use proptest::prelude::*;
use serde_json::Value;

/// Arbitrary JSON documents (numbers kept to integers and short decimals).
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(Value::from),
        (-1000i32..1000, 1u32..100)
            .prop_map(|(a, b)| Value::from(f64::from(a) + f64::from(b) / 128.0)),
        "[a-zA-Z0-9 é€😀\"\\\\\n]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Writes `v` as JSON with its own choices of member order, whitespace and number spelling.
fn coin(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    (*seed >> 33) % 3
}

fn write_variant(v: &Value, seed: &mut u64, out: &mut String) {
    let ws = |c: u64| match c {
        0 => "",
        1 => " ",
        _ => "\n  ",
    };
    match v {
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            if coin(seed) == 1 {
                members.reverse();
            } else if coin(seed) == 2 && members.len() > 1 {
                members.rotate_left(1);
            }
            out.push('{');
            for (i, (k, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(ws(coin(seed)));
                out.push_str(&serde_json::to_string(k).unwrap());
                out.push_str(ws(coin(seed)));
                out.push(':');
                out.push_str(ws(coin(seed)));
                write_variant(item, seed, out);
            }
            out.push_str(ws(coin(seed)));
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(ws(coin(seed)));
                write_variant(item, seed, out);
            }
            out.push(']');
        }
        Value::Number(n) if n.is_i64() => match coin(seed) {
            0 => out.push_str(&n.to_string()),
            1 => out.push_str(&format!("{n}.0")),
            _ => out.push_str(&format!("{n}e0")),
        },
        other => out.push_str(&serde_json::to_string(other).unwrap()),
    }
}

fn fp(body: &str) -> fingerprint::Fingerprint {
    fingerprint(&fingerprint::Request {
        method: "POST",
        path: "/payments",
        query: None,
        content_type: Some(b"application/json"),
        body: body.as_bytes(),
        fields: None,
    })
    .unwrap()
}

fn leaves(v: &Value) -> usize {
    match v {
        Value::Object(map) => map.values().map(leaves).sum(),
        Value::Array(items) => items.iter().map(leaves).sum(),
        _ => 1,
    }
}

/// Changes one leaf of `v` (the `n`-th reached), returning whether it changed anything.
fn mutate(v: &mut Value, n: &mut usize) -> bool {
    match v {
        Value::Object(map) => map.values_mut().any(|item| mutate(item, n)),
        Value::Array(items) => items.iter_mut().any(|item| mutate(item, n)),
        leaf => {
            if *n > 0 {
                *n -= 1;
                return false;
            }
            *leaf = match leaf {
                Value::Null => Value::Bool(false),
                Value::Bool(b) => Value::Bool(!*b),
                Value::Number(num) => Value::from(num.as_f64().unwrap() + 1.0),
                Value::String(s) => Value::String(format!("{s}x")),
                _ => unreachable!(),
            };
            true
        }
    }
}

/// Paths made of segments servers care about: plain words, escapes (good and bad, upper
/// and lower case), dots, empty segments, `;`, non-ASCII and characters to be escaped.
fn raw_path() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-zA-Z0-9_~-]{1,6}",
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just(String::new()),
        "%[0-9a-fA-F]{2}",
        Just("%".to_owned()),
        Just("é".to_owned()),
        Just("|".to_owned()),
        Just(";v=1".to_owned()),
        Just("%2e".to_owned()),
    ];
    prop::collection::vec(
        prop::collection::vec(piece, 1..4).prop_map(|p| p.concat()),
        0..6,
    )
    .prop_map(|segments| format!("/{}", segments.join("/")))
}

/// Another spelling of a normalised path, as a client might send it: doubled slashes,
/// `.` and `x/..` segments, unreserved characters percent-encoded in either case, and a
/// trailing slash.
fn respell(normal: &str, seed: u64) -> String {
    let mut s = seed;
    let mut out = String::new();
    for segment in normal.split('/').skip(1) {
        out.push('/');
        match coin(&mut s) {
            0 => out.push('/'),
            1 => out.push_str("./x/../"),
            _ => {}
        }
        let bytes = segment.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if b == b'%' {
                // An escape that must stay: only the case of its digits may change.
                let escape = &segment[i..i + 3];
                if coin(&mut s) == 1 {
                    out.push_str(&escape.to_ascii_lowercase());
                } else {
                    out.push_str(escape);
                }
                i += 3;
                continue;
            }
            let unreserved = b.is_ascii_alphanumeric() || b"-._~".contains(&b);
            match coin(&mut s) {
                1 if unreserved => out.push_str(&format!("%{b:02x}")),
                2 if unreserved => out.push_str(&format!("%{b:02X}")),
                _ => out.push(char::from(b)),
            }
            i += 1;
        }
    }
    if coin(&mut s) == 0 {
        out.push('/');
    }
    if out.is_empty() { "/".to_owned() } else { out }
}

/// The fingerprint of a `POST` on `path` as the proxy computes it: normalised and looked
/// up in the route table first, then fingerprinted on the path the route yields.
fn fp_on_path(
    routes: &idemproxy::config::RouteTable,
    path: &str,
) -> Option<fingerprint::Fingerprint> {
    let Lookup::Route(_, routed) = routes.resolve(&http::Method::POST, path) else {
        return None;
    };
    fingerprint(&fingerprint::Request {
        method: "POST",
        path: &routed,
        query: None,
        content_type: Some(b"application/json"),
        body: br#"{"amount":1}"#,
        fields: None,
    })
    .ok()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, failure_persistence: None, ..ProptestConfig::default() })]

    /// Normalising is idempotent: a normal path is its own normal form (and is borrowed).
    #[test]
    fn normalising_is_idempotent(path in raw_path()) {
        if let Ok(normal) = normalize(&path) {
            let again = normalize(&normal);
            prop_assert_eq!(again.as_deref(), Ok(&*normal));
            prop_assert!(matches!(again, Ok(std::borrow::Cow::Borrowed(_))), "{} -> {}", path, normal);
            prop_assert!(!normal.contains("//") && (normal == "/" || !normal.ends_with('/')));
        }
    }

    /// Two spellings of one path normalise alike, match the same route and fingerprint
    /// alike; so one key sent under both executes once.
    #[test]
    fn spellings_fingerprint_alike(path in raw_path(), seed in any::<u64>()) {
        let Ok(normal) = normalize(&path) else { return Ok(()) };
        prop_assume!(!normal.contains(';'));
        let other = respell(&normal, seed);
        let renormal = normalize(&other);
        prop_assert_eq!(renormal.as_deref(), Ok(&*normal), "{}", other);
        let config = load_str(
            "upstream:\n  url: http://127.0.0.1:1\nroutes:\n  - name: p\n    path: /payments\n  - name: all\n    path: /*\n",
            &Overrides::default(),
        ).unwrap();
        let (a, b) = (fp_on_path(&config.routes, &path), fp_on_path(&config.routes, &other));
        prop_assert!(a.is_some());
        prop_assert_eq!(a, b, "{} vs {}", path, other);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    /// Reordered members, other whitespace and equivalent number spellings keep the
    /// fingerprint.
    #[test]
    fn fingerprint_ignores_serialisation(v in json(), seed in any::<u64>()) {
        let compact = serde_json::to_string(&v).unwrap();
        let mut variant = String::new();
        let mut s = seed;
        write_variant(&v, &mut s, &mut variant);
        prop_assert_eq!(fp(&compact), fp(&variant), "{} vs {}", compact, variant);
    }

    /// Any change of any value changes the fingerprint.
    #[test]
    fn fingerprint_sees_every_value(v in json(), pick in 0usize..1000) {
        let count = leaves(&v);
        prop_assume!(count > 0);
        let mut changed = v.clone();
        let mut n = pick % count;
        prop_assume!(mutate(&mut changed, &mut n));
        prop_assert_ne!(fp(&serde_json::to_string(&v).unwrap()), fp(&serde_json::to_string(&changed).unwrap()));
    }

    /// The key parser never panics on any header value, and accepts any plain key as is.
    #[test]
    fn key_parser_total(raw in prop::collection::vec(any::<u8>(), 0..300), plain in "[!#-+\\--~]{1,255}") {
        let name = HeaderName::from_static("idempotency-key");
        if let Ok(value) = HeaderValue::from_bytes(&raw) {
            let mut h = HeaderMap::new();
            h.insert(name.clone(), value);
            let _ = parse_key(&h, &name);
        }
        let mut h = HeaderMap::new();
        h.insert(name.clone(), HeaderValue::from_str(&plain).unwrap());
        let parsed = parse_key(&h, &name);
        if plain.starts_with('"') {
            let _ = parsed;
        } else {
            prop_assert_eq!(parsed, Ok(Some(plain.clone())));
        }
    }

    /// The body key reader never panics on any body, JSON document or pointer, and finds
    /// a key placed at the pointer exactly as it was placed.
    #[test]
    fn body_key_total(
        raw in prop::collection::vec(any::<u8>(), 0..300),
        v in json(),
        pointer in "(/[a-z~01]{0,4}){0,3}",
        key in "[!#-+\\--~]{1,64}",
    ) {
        for ct in [&b"application/json"[..], b"application/x-www-form-urlencoded", b"text/plain"] {
            let _ = body_key(Some(ct), &raw, &pointer);
            let _ = body_key(Some(ct), serde_json::to_string(&v).unwrap().as_bytes(), &pointer);
        }
        let doc = serde_json::json!({ "a": { "idempotency_key": key.clone() }, "other": v });
        let body = serde_json::to_vec(&doc).unwrap();
        prop_assert_eq!(
            body_key(Some(b"application/json"), &body, "/a/idempotency_key"),
            Ok(Some(key.clone()))
        );
    }

    /// Stored header blocks and route patterns never panic, whatever the bytes.
    #[test]
    fn decoders_total(raw in prop::collection::vec(any::<u8>(), 0..500), pattern in "\\PC{0,40}") {
        let _ = decode_stored(&raw);
        if let Ok(p) = PathPattern::parse(&pattern) {
            let _ = p.matches("/payments/1/refunds");
        }
    }

    /// The configuration loader never panics on arbitrary text.
    #[test]
    fn config_loader_total(text in "\\PC{0,300}") {
        let _ = load_str(&text, &Overrides::default());
    }

    /// An unknown key anywhere is rejected with its name and the path to it.
    #[test]
    fn unknown_keys_are_named(key in "[a-z]{3,10}_[a-z]{3,10}", section in 0usize..4) {
        let text = match section {
            0 => format!("upstream:\n  url: http://127.0.0.1:1\n{key}: 1\n"),
            1 => format!("upstream:\n  url: http://127.0.0.1:1\n  {key}: 1\n"),
            2 => format!("upstream:\n  url: http://127.0.0.1:1\ndefaults:\n  {key}: 1\n"),
            _ => format!("upstream:\n  url: http://127.0.0.1:1\nroutes:\n  - name: a\n    path: /a\n    {key}: 1\n"),
        };
        let err = load_str(&text, &Overrides::default()).unwrap_err().to_string();
        prop_assert!(err.contains(&key), "{}", err);
        let path = ["", "upstream", "defaults", "routes[0]"][section];
        prop_assert!(err.contains(path), "{}", err);
    }
}
