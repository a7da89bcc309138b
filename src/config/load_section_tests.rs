//! The configuration's sections checked one by one: reconciliation, key forms, the
//! store's failover timeouts, error dialects — each mistake named by its key.

use super::tests::{UP, err};
use super::*;
use crate::config::{DEFAULT_RECONCILE_BATCH, DEFAULT_RECONCILE_INTERVAL, Reconcile};

/// The reconciler can only ask a recovery probe: turned on with none configured it is
/// refused; with one it takes its defaults, and the printed configuration shows them.
#[test]
fn reconcile_needs_a_probe() {
    let e = err(&format!("{UP}reconcile: {{}}\n"));
    assert!(
        e.contains("reconcile:") && e.contains("recovery_probe"),
        "{e}"
    );
    let e = err(&format!(
        "{UP}defaults:\n  recovery_probe:\n    path: \"/p/{{key}}\"\nreconcile:\n  interval: 0s\n  batch: 0\n"
    ));
    assert!(
        e.contains("reconcile.interval") && e.contains("reconcile.batch"),
        "{e}"
    );
    let c = load_str(
        &format!("{UP}defaults:\n  recovery_probe:\n    path: \"/p/{{key}}\"\nreconcile: {{}}\n"),
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(
        c.reconcile,
        Some(Reconcile {
            interval: DEFAULT_RECONCILE_INTERVAL,
            batch: DEFAULT_RECONCILE_BATCH
        })
    );
    assert!(
        c.to_string()
            .contains("reconcile:\n  interval: 30s\n  batch: 50\n"),
        "{c}"
    );
    let off = load_str(UP, &Overrides::default()).unwrap();
    assert_eq!(off.reconcile, None);
    assert!(off.to_string().contains("# reconcile: off"));
}

/// The key knobs: aliases, scope, fingerprint forms and answer marks, each refused with
/// its key named when it cannot work.
#[test]
fn key_forms_are_checked() {
    let route = |extra: &str| format!("{UP}routes:\n  - name: a\n    path: /a\n{extra}");
    let e = err(&route("    key_header: A\n    key_headers: [B]\n"));
    assert!(
        e.contains("routes[0].key_headers") && e.contains("not both"),
        "{e}"
    );
    let e = err(&route("    key_headers: [A, a]\n"));
    assert!(
        e.contains("routes[0].key_headers[1]") && e.contains("twice"),
        "{e}"
    );
    let e = err(&route("    key_headers: []\n"));
    assert!(e.contains("routes[0].key_headers"), "{e}");
    let e = err(&route(
        "    upstream_key: {}\n    key_from: { body: \"\" }\n",
    ));
    assert!(
        e.contains("routes[0].upstream_key:") && e.contains("routes[0].key_from.body"),
        "{e}"
    );
    let e = err(&route("    derived_key: { max_length: 21 }\n"));
    assert!(
        e.contains("routes[0].derived_key.max_length") && e.contains("22"),
        "{e}"
    );
    let e = err(&route("    derived_key: { hash: md5 }\n"));
    assert!(e.contains("routes[0].derived_key.hash"), "{e}");
    let e = err(&route("    key_scope: global\n"));
    assert!(
        e.contains("routes[0].key_scope") && e.contains("client_and_route"),
        "{e}"
    );
    let e = err(&route("    fingerprint: off\n"));
    assert!(
        e.contains("routes[0].fingerprint") && e.contains("none"),
        "{e}"
    );
    let e = err(&route("    fingerprint: { headers: [\"bad header\"] }\n"));
    assert!(e.contains("routes[0].fingerprint.headers[0]"), "{e}");
    let c = load_str(
            &route("    key_headers: [X-Idempotency-Key, PayPal-Request-Id]\n    key_scope: client_and_route\n    fingerprint: none\n    echo_key_header: none\n"),
            &Overrides::default(),
        )
        .unwrap();
    let p = &c.routes.routes()[0].policy;
    assert_eq!(p.key_headers.len(), 2);
    assert_eq!(p.key_header().as_str(), "x-idempotency-key");
    assert!(p.fingerprint_off);
    assert_eq!(p.echo_key, crate::config::EchoKey::Off);
    let printed = c.to_string();
    assert!(
        printed.contains("key_headers: [x-idempotency-key, paypal-request-id]")
            && printed.contains("key_scope: client_and_route")
            && printed.contains("fingerprint: none"),
        "{printed}"
    );
}

/// A `connect_timeout` not well under the store timeout is accepted, with a warning that
/// says what a vanished first host costs; the default and half the timeout are quiet.
#[test]
fn slow_failover_settings_are_warned_about() {
    let with = |extra: &str| {
        let text = format!(
            "{UP}store:\n  postgres:\n    url: postgres://u@old:5432,new:5432/pay?target_session_attrs=read-write\n    timeout: 1s\n{extra}"
        );
        load_str(&text, &Overrides::default()).map(|c| c.warnings)
    };
    let quiet = |extra: &str| {
        let w = with(extra).unwrap();
        assert!(!w.iter().any(|w| w.contains("connect_timeout")), "{w:?}");
    };
    quiet("");
    quiet("    connect_timeout: 500ms\n");
    for slow in ["    connect_timeout: 1s\n", "    connect_timeout: 3s\n"] {
        let warnings = with(slow).unwrap();
        let w = warnings
            .iter()
            .find(|w| w.contains("store.postgres.connect_timeout"))
            .unwrap_or_else(|| panic!("{slow}: {warnings:?}"));
        assert!(w.contains("the next host") && w.contains("503"), "{w}");
    }
    let warnings = with("    connect_timeout: 3s\n").unwrap();
    assert!(
        warnings.iter().any(|w| w.contains("about 4s of 503s")),
        "{warnings:?}"
    );
}

/// `errors` picks a dialect in `defaults` and per route; a template that cannot render
/// JSON, or an unknown dialect, is refused with the key named.
#[test]
fn error_dialects_are_configured_and_checked() {
    let c = load_str(
        &format!(
            "{UP}defaults:\n  errors: stripe\nroutes:\n  - name: a\n    path: /a\n  - name: b\n    path: /b\n    errors: problem\n  - name: c\n    path: /c\n    errors:\n      template: '{{\"errorCode\": \"{{code}}\", \"status\": {{status}}}}'\n      content_type: application/vnd.acme+json\n"
        ),
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(c.errors.name(), "stripe");
    let names: Vec<&str> = c
        .routes
        .routes()
        .iter()
        .map(|r| r.policy.errors.name())
        .collect();
    assert_eq!(names, ["stripe", "problem", "template"]);
    let e = err(&format!(
        "{UP}routes:\n  - name: c\n    path: /c\n    errors:\n      template: '{{\"errorCode\": {{code}}}}'\n"
    ));
    assert!(
        e.contains("routes[0].errors.template") && e.contains("valid JSON"),
        "{e}"
    );
    let e = err(&format!("{UP}defaults:\n  errors: graphql\n"));
    assert!(e.contains("defaults.errors") && e.contains("stripe"), "{e}");
}

/// Presets by name or with `outcomes:` over them; everything that would make an answer
/// unreadable refused with the key named.
#[test]
fn presets_and_outcomes_are_configured_and_checked() {
    let c = load_str(
        &format!(
            "{UP}routes:\n  - name: a\n    path: /a\n    errors: square\n  - name: b\n    path: /b\n    errors:\n      preset: adyen\n      outcomes:\n        in-progress: {{ status: 409, headers: {{ X-Busy: 'yes' }} }}\n  - name: c\n    path: /c\n    errors:\n      outcomes:\n        key-reused: {{ status: 409, message: used }}\n"
        ),
        &Overrides::default(),
    )
    .unwrap();
    let names: Vec<&str> = c
        .routes
        .routes()
        .iter()
        .map(|r| r.policy.errors.name())
        .collect();
    assert_eq!(names, ["square", "adyen", "problem"]);
    assert!(!c.routes.routes()[2].policy.errors.is_plain());
    for (errors, key, says) in [
        ("errors: { preset: visa }", "errors.preset", "`visa`"),
        (
            "errors: { preset: adyen, template: '{}' }",
            "errors",
            "not both",
        ),
        (
            "errors: { preset: adyen, content_type: text/plain }",
            "errors.content_type",
            "preset",
        ),
        (
            "errors: { preset: adyen, outcomes: { key-used: {} } }",
            "errors.outcomes.key-used",
            "no outcome",
        ),
        (
            "errors: { preset: adyen, outcomes: { key-reused: { status: 200 } } }",
            "errors.outcomes.key-reused.status",
            "not an error",
        ),
        (
            "errors: { preset: adyen, outcomes: { key-reused: { headers: { Retry-After: '1' } } } }",
            "errors.outcomes.key-reused.headers.Retry-After",
            "sets this header",
        ),
        (
            "errors: { outcomes: { key-reused: { code: X } } }",
            "errors.outcomes.key-reused.code",
            "problem document",
        ),
        ("errors: {}", "errors", "give `preset`"),
    ] {
        let e = err(&format!(
            "{UP}routes:\n  - name: a\n    path: /a\n    {errors}\n"
        ));
        assert!(
            e.contains(&format!("routes[0].{key}")) && e.contains(says),
            "{errors}: {e}"
        );
    }
}
