//! The configuration as operators write it: what is accepted, what it means, and how
//! each mistake is named.

use super::*;
use crate::config::{ClientIdSource, OnConflict, StoreConfig};

/// The smallest upstream section, for configurations that are about something else.
pub(super) const UP: &str = "upstream:\n  url: http://127.0.0.1:3000\n";

/// The error a configuration is refused with.
pub(super) fn err(text: &str) -> String {
    load_str(text, &Overrides::default())
        .unwrap_err()
        .to_string()
}

/// The design document's example parses and means what it says.
#[test]
fn design_example_parses() {
    let text = r#"
listen: 127.0.0.1:8080
admin_listen: 127.0.0.1:9090
upstream:
  url: http://127.0.0.1:3000
  connect_timeout: 2s
  timeout: 20s
store:
  postgres:
    url: postgres://postgres@127.0.0.1:5432/idemproxy
    pool_size: 16
client_id:
  header: X-Client-Id
defaults:
  key_header: Idempotency-Key
  upstream_key_header: Idempotency-Key
  lease: 30s
  retention: 24h
  max_body: 1MiB
  max_stored_response: 1MiB
  require_key: false
  on_conflict: reject
routes:
  - name: create-payment
    methods: [POST]
    path: /payments
    require_key: true
    on_conflict: { wait: 5s }
    fingerprint:
      fields: [/amount, /currency, /recipient, /purpose]
  - name: refund
    methods: [POST]
    path: /payments/{id}/refunds
"#;
    let c = load_str(text, &Overrides::default()).unwrap();
    assert!(matches!(c.store, StoreConfig::Postgres(ref pg) if pg.pool_size == 16));
    assert_eq!(
        c.client_id,
        ClientIdSource::Header(http::HeaderName::from_static("x-client-id"))
    );
    let routes = c.routes.routes();
    assert_eq!(routes.len(), 2);
    assert!(routes[0].policy.require_key);
    assert_eq!(
        routes[0].policy.on_conflict,
        OnConflict::Wait(std::time::Duration::from_secs(5))
    );
    assert_eq!(
        routes[0].policy.fingerprint_fields.as_ref().unwrap().len(),
        4
    );
    assert!(!routes[1].policy.require_key);
    assert_eq!(routes[1].policy.lease, std::time::Duration::from_secs(30));
}

/// An unknown key is an error that names its full path.
#[test]
fn unknown_keys_name_their_path() {
    let e = err(&format!(
        "{UP}routes:\n  - name: a\n    path: /a\n    fingerprint:\n      feilds: [/a]\n"
    ));
    assert!(e.contains("routes[0].fingerprint"), "{e}");
    assert!(e.contains("feilds"), "{e}");
    let e = err(&format!("{UP}defaults:\n  leese: 3s\n"));
    assert!(e.contains("defaults") && e.contains("leese"), "{e}");
}

/// Impossible settings are rejected with the key named.
#[test]
fn impossible_settings_are_rejected() {
    let e = err(&format!("{UP}defaults:\n  lease: 2s\n"));
    assert!(
        e.contains("defaults.lease") && e.contains("too short"),
        "{e}"
    );
    let e = err(&format!("{UP}defaults:\n  lease: 1h\n  retention: 30m\n"));
    assert!(e.contains("defaults.retention"), "{e}");
    let e = err(&format!(
        "{UP}routes:\n  - name: a\n    path: /a\n  - name: a\n    path: /b\n"
    ));
    assert!(e.contains("routes[1].name") && e.contains("unique"), "{e}");
    let e = err(&format!(
        "{UP}routes:\n  - name: a\n    path: /a\n    fingerprint: {{ fields: [amount] }}\n"
    ));
    assert!(e.contains("routes[0].fingerprint.fields[0]"), "{e}");
    let e = err("listen: nowhere\n");
    assert!(e.contains("listen") && e.contains("upstream.url"), "{e}");
}

/// A misspelt method is refused (it would leave the real one unprotected); an extension
/// method is accepted only where the route declares it.
#[test]
fn methods_must_be_registered() {
    let e = err(&format!(
        "{UP}routes:\n  - name: a\n    path: /a\n    methods: [PSOT]\n"
    ));
    assert!(
        e.contains("routes[0].methods[0]") && e.contains("PSOT"),
        "{e}"
    );
    assert!(e.contains("extension_methods"), "{e}");
    let c = load_str(
            &format!("{UP}routes:\n  - name: a\n    path: /a\n    methods: [post, CHARGE]\n    extension_methods: [CHARGE]\n"),
            &Overrides::default(),
        )
        .unwrap();
    let charge = http::Method::from_bytes(b"CHARGE").unwrap();
    assert_eq!(
        c.routes.routes()[0].methods,
        [http::Method::POST, charge.clone()]
    );
    assert!(c.routes.route_for(&charge, "/a").is_some());
    assert!(c.to_string().contains("extension_methods: [CHARGE]"));
    let e = err(&format!(
        "{UP}routes:\n  - name: a\n    path: /a\n    extension_methods: [POST]\n"
    ));
    assert!(
        e.contains("routes[0].extension_methods[0]") && e.contains("registered"),
        "{e}"
    );
}

/// `routes: []` would protect nothing without a word: refused.
#[test]
fn empty_routes_are_refused() {
    let e = err(&format!("{UP}routes: []\n"));
    assert!(
        e.contains("routes:") && e.contains("protects nothing"),
        "{e}"
    );
}

/// A route that an earlier one shadows is named in a warning, with the methods.
#[test]
fn shadowed_routes_are_named() {
    let c = load_str(
            &format!(
                "{UP}routes:\n  - name: all\n    path: /payments/*\n  - name: refund\n    path: /payments/{{id}}/refunds\n    methods: [POST, PUT]\n  - name: other\n    path: /orders\n"
            ),
            &Overrides::default(),
        )
        .unwrap();
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    let w = &c.warnings[0];
    assert!(
        w.contains("routes[1]") && w.contains("refund") && w.contains("routes[0]"),
        "{w}"
    );
    assert!(
        w.contains("for POST") && w.contains("never applies to those methods"),
        "{w}"
    );
    assert!(c.to_string().contains("# warning: routes[1]"));
}

/// The configuration `check-config` prints is one that `--config` accepts, and it
/// means the same: printed again, it prints the same (but for the admin token, which
/// it never prints).
#[test]
fn printed_configuration_reads_back() {
    let text = format!(
        "{UP}admin_token: secret\nreconcile: {{}}\nsweep:\n  unresolved_retention: 7d\nroutes:\n  - name: pay\n    path: /pay/{{id}}\n    methods: [POST, PATCH]\n    require_key: true\n    key_headers: [Idempotency-Key, X-Idempotency-Key]\n    key_from: {{ body: /idempotency_key }}\n    upstream_key: {{ body: /key }}\n    derived_key: {{ max_length: 64 }}\n    on_conflict: {{ wait: 5s }}\n    store_headers: [X-Request-Id]\n    release_on: [503]\n    takeover: never\n    fingerprint:\n      fields: [/amount]\n      headers: [Stripe-Version]\n    recovery_probe:\n      path: \"/probe/{{key}}\"\n  - name: other\n    path: /other\n    fingerprint: none\n    echo_key_header: none\n    key_scope: client_and_route\n"
    );
    let first = load_str(&text, &Overrides::default()).unwrap().to_string();
    assert!(!first.contains("secret"), "{first}");
    let again = load_str(&first, &Overrides::default())
        .unwrap_or_else(|e| panic!("{e}\n{first}"))
        .to_string();
    // The token is never printed, so it is the one line that reads back otherwise.
    let without_token = |text: &str| {
        text.lines()
            .filter(|l| !l.starts_with("# admin_token"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(without_token(&first), without_token(&again));
}

/// Durations must carry a unit.
#[test]
fn durations_need_units() {
    let e = err(&format!("{UP}defaults:\n  lease: 30\n"));
    assert!(e.contains("defaults.lease") && e.contains("unit"), "{e}");
}

/// With no file at all, `--upstream` alone yields a runnable embedded configuration
/// protecting every POST and PATCH.
#[test]
fn overrides_alone_are_enough() {
    let o = Overrides {
        upstream: Some("http://127.0.0.1:3000".into()),
        ..Default::default()
    };
    let c = load(None, &o).unwrap();
    assert!(matches!(c.store, StoreConfig::Embedded { .. }));
    assert!(c.implicit_routes);
    assert!(
        c.routes
            .route_for(&http::Method::POST, "/anything")
            .is_some()
    );
    assert!(
        c.routes
            .route_for(&http::Method::GET, "/anything")
            .is_none()
    );
    let o = Overrides {
        database_url: Some("postgres://u:secret@h/db".into()),
        ..o
    };
    let c = load(None, &o).unwrap();
    assert!(matches!(c.store, StoreConfig::Postgres(_)));
    assert!(!c.to_string().contains("secret"));
}

/// One run names every mistake of a file — structural ones (typos, wrong types) and
/// the checks' — once each, and nothing that follows only from a reported one.
#[test]
fn every_problem_in_one_run() {
    let e = err(&format!(
        "{UP}  max_connections: many
routes:
  - name: a
    path: /payments
    release_on: [5xx, 503]
    on_conflict: {{ wiat: 5s }}
    fingerprint:
      feilds: [/amount]
    lease: 1s
  - name: b
    path: /x
    methdos: [POST]
sweeep:
  interval: 1m
tls: nope
"
    ));
    let lines: Vec<&str> = e.lines().skip(1).map(str::trim).collect();
    for expected in [
        "upstream.max_connections: expected a whole number",
        "routes[0].release_on[0]: expected an HTTP status code",
        "routes[0].on_conflict.wiat: unknown key `wiat`: did you mean `wait`?",
        "routes[0].fingerprint.feilds: unknown key `feilds`: did you mean `fields`?",
        "routes[0].lease: 1s is too short",
        "routes[1].methdos: unknown key `methdos`: did you mean `methods`?",
        "sweeep: unknown key `sweeep`: did you mean `sweep`?",
        "tls: expected a mapping",
    ] {
        assert_eq!(
            lines.iter().filter(|l| l.starts_with(expected)).count(),
            1,
            "{expected} in\n{e}"
        );
    }
    assert_eq!(lines.len(), 8, "nothing else:\n{e}");
}

/// A mistyped section is reported as itself, not also as the keys it lacks.
#[test]
fn a_wrong_section_is_not_also_missing() {
    let e = err("upstream: http://127.0.0.1:3000\n");
    assert!(e.contains("upstream: expected a mapping"), "{e}");
    assert!(!e.contains("upstream.url"), "{e}");
}

#[test]
fn word_or_mapping_settings_say_what_they_take() {
    let e = err(&format!("{UP}defaults:\n  on_conflict: 5\n"));
    assert!(
        e.contains("expected `reject` or `{ wait: DURATION }`"),
        "{e}"
    );
    assert!(!e.contains("variant"), "{e}");
    let e = err(&format!("{UP}defaults:\n  derived_key: [sha256]\n"));
    assert!(
        e.contains("`plain`, `{ hash: sha256 }` or `{ max_length: N }`"),
        "{e}"
    );
}

#[test]
fn a_key_written_twice_is_refused_in_plain_words() {
    let e = err(&format!("{UP}listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n"));
    assert!(
        e.contains("duplicate key listen") && e.contains("line 4"),
        "{e}"
    );
    assert!(!e.contains("DuplicateKeyPolicy"), "{e}");
    let e = err(&format!(
        "{UP}routes:\n  - name: a\n    path: /a\n    path: /b\n"
    ));
    assert!(e.contains("duplicate key path"), "{e}");
}

#[test]
fn tracing_needs_an_otlp_http_endpoint() {
    let c = load_str(UP, &Overrides::default()).unwrap();
    assert!(c.tracing.is_none(), "off by default");
    let c = load_str(
        &format!("{UP}tracing:\n  otlp_endpoint: http://collector:4318\n"),
        &Overrides::default(),
    )
    .unwrap();
    let t = c.tracing.unwrap();
    assert_eq!(t.traces_url, "http://collector:4318/v1/traces");
    assert_eq!(t.service_name, "idemproxy");
    let c = load_str(
        &format!("{UP}tracing:\n  otlp_endpoint: https://otel.example/custom/path\n"),
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(
        c.tracing.unwrap().traces_url,
        "https://otel.example/custom/path"
    );
    for (bad, key) in [
        ("tracing: {}", "tracing.otlp_endpoint"),
        (
            "tracing:\n  otlp_endpoint: grpc://collector:4317",
            "tracing.otlp_endpoint",
        ),
        (
            "tracing:\n  otlp_endpoint: http://c:4318\n  service_name: ''",
            "tracing.service_name",
        ),
    ] {
        let e = err(&format!("{UP}{bad}\n"));
        assert!(e.contains(key), "{bad}: {e}");
    }
}
