//! The official Python SDKs of Adyen, PayPal, Checkout.com and Square (installed by
//! `tests/run` into `tests/sdk/.venv`), each against the proxy with its API's error preset in
//! front of a provider that speaks the API's create-payment endpoint
//! ([`support::provider`]), the key where that SDK puts it: create, replay, a reused key, a
//! key in flight (rejected, and waited for), a stored `500`, the store down, a missing key,
//! a key of the API's maximum length, and two credentials of one tenant.
//!
//! The assertion is what the SDK raises — the API's own error code, in the API's own
//! exception — and what reached the provider, counted: every payment executed once, nothing
//! forwarded that the proxy refused. The script (`tests/sdk/payment_apis.py`) reports; this
//! file decides.

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};
use support::provider::{Api, Provider};
use support::*;

/// The route each API's page in docs/apis/ tells a user to copy, and the identity it
/// recommends: a credential → tenant map where the API key is fixed; where it is an OAuth
/// token (PayPal), `static` for one merchant or the gateway's header for several.
fn config(api: Api, on_conflict: &str, one_merchant: bool) -> String {
    let route = match api {
        Api::Adyen => {
            "  - name: payments\n    path: /v72/payments\n    require_key: true\n    derived_key: { max_length: 64 }\n    errors: adyen\n"
        }
        Api::PayPal => {
            "  - name: orders\n    path: /v2/checkout/orders\n    require_key: true\n    key_header: PayPal-Request-Id\n    upstream_key_header: PayPal-Request-Id\n    derived_key: { max_length: 108 }\n    errors: paypal\n"
        }
        Api::Checkout => {
            "  - name: payments\n    path: /payments\n    require_key: true\n    key_header: Cko-Idempotency-Key\n    upstream_key_header: Cko-Idempotency-Key\n    errors: checkout\n"
        }
        Api::Square => {
            "  - name: payments\n    path: /v2/payments\n    require_key: true\n    key_from: { body: /idempotency_key }\n    upstream_key: { body: /idempotency_key }\n    derived_key: { max_length: 45 }\n    errors: square\n"
        }
    };
    let client_id = match api {
        Api::PayPal if one_merchant => "  static: my-shop\n".to_owned(),
        Api::PayPal => "  header: X-Tenant\n".to_owned(),
        _ => {
            let header = match api {
                Api::Adyen => "X-API-Key",
                _ => "Authorization",
            };
            let [a1, a2, b] =
                credentials(api).map(|c| format!("sha256:{}", idemproxy::key::hex(&c)));
            format!(
                "  credentials:\n    header: {header}\n    tenants:\n      shop-a: [{a1}, {a2}]\n      shop-b: [{b}]\n"
            )
        }
    };
    format!(
        "upstream:\n  url: {{upstream}}\n  timeout: 10s\n{{store}}\nclient_id:\n{client_id}defaults:\n  lease: 30s\n  on_conflict: {on_conflict}\nroutes:\n{route}"
    )
}

/// What the SDK is given (an API key, a secret key, an access token; for PayPal the
/// tenant the gateway sets): two of tenant A's, one of tenant B's.
fn given(api: Api) -> [&'static str; 3] {
    match api {
        Api::Adyen => [
            "AQE1hmfxKo3-key-one",
            "AQE1hmfxKo3-key-two",
            "AQEyhmfxK-other",
        ],
        Api::PayPal => ["shop-a", "shop-a", "shop-b"],
        Api::Checkout => [
            "sk_sbox_m73dzbpy7cf3gfd46xr4yj5xo4e",
            "sk_sbox_m73dzbpy7cf3gfd46xr4yj5xo4f",
            "sk_sbox_zzwq3kqvx2jhtbnhh4fcazg2vmd",
        ],
        Api::Square => ["EAAAl-token-one", "EAAAl-token-two", "EAAAl-other"],
    }
}

/// The header values those become, hashed as `client_id.credentials` lists them.
fn credentials(api: Api) -> [[u8; 32]; 3] {
    given(api).map(|g| {
        let value = match api {
            Api::Adyen => g.to_owned(),
            _ => format!("Bearer {g}"),
        };
        Sha256::digest(value.as_bytes()).into()
    })
}

/// Runs the script for `api` against its proxies; its results, and the provider.
/// `one_merchant`: PayPal as one merchant's SDK sends it, no gateway in front (`static`).
async fn run(api: Api, name: &str, one_merchant: bool) -> (Value, Provider) {
    let python = std::env::var_os("IDEMPROXY_SDK_PYTHON").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/.venv/bin/python"),
        PathBuf::from,
    );
    assert!(
        python.exists(),
        "{} is missing: `tests/run --setup` installs the SDKs",
        python.display()
    );
    let provider = Provider::spawn(api).await;
    // The test support's proxy takes an `Upstream` for `{upstream}`; the provider is
    // substituted here instead.
    let spawn = |on_conflict: &str, store: Option<String>| {
        let text = config(api, on_conflict, one_merchant).replace("{upstream}", &provider.url());
        async move {
            let db = Backend::embedded();
            let text = text.replace("{store}", &store.unwrap_or_else(|| db.store_yaml()));
            let idle = Upstream::spawn(Behavior::default()).await;
            (TestProxy::spawn(&text, &idle, &db).await, db)
        }
    };
    let (proxy, _db) = spawn("reject", None).await;
    let (waiting, _db_wait) = spawn("{ wait: 5s }", None).await;
    // A store nothing answers at: a closed port.
    let closed = free_port();
    let (down, _db_down) = spawn(
        "reject",
        Some(format!("store:\n  postgres:\n    url: postgres://postgres@127.0.0.1:{closed}/none\n    timeout: 1s\n    pool_size: 1\n")),
    )
    .await;
    let [a1, a2, b] = given(api);
    let out = tokio::process::Command::new(&python)
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/payment_apis.py"))
        .env("API", name)
        .env("PROXY", proxy.addr.to_string())
        .env("PROXY_WAIT", waiting.addr.to_string())
        .env("PROXY_DOWN", down.addr.to_string())
        .env("TENANT_A1", a1)
        .env("TENANT_A2", a2)
        .env("TENANT_B", b)
        .env("ONE_MERCHANT", if one_merchant { "1" } else { "" })
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), out)
        .await
        .expect("the SDK script finished")
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    for p in [proxy, waiting, down] {
        p.stop().await;
    }
    let results = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{name} printed no results ({e}): {stdout}"));
    (results, provider)
}

/// The API's own error: the SDK's exception class, the status, the API's code.
fn raised(r: &Value, class: &str, status: u16, code: &str) -> bool {
    let e = &r["error"];
    e["class"] == class && e["status"] == status && e["code"] == code
}

/// What every SDK must show; `expect` holds each API's own error for each refusal.
fn check(api: Api, r: &Value, provider: &Provider, expect: &Expected) {
    let id = |v: &Value| v["ok"].as_str().map(str::to_owned);
    // Create and replay: one payment, the same id.
    let created = id(&r["create"]).unwrap_or_else(|| panic!("{api:?}: {r}"));
    assert_eq!(id(&r["replay"]).as_deref(), Some(&*created), "{api:?}: {r}");
    // The reused key, in flight (without wait), missing, the store down: the API's code.
    let (class, status, code) = expect.reused;
    assert!(
        raised(&r["reused"], class, status, code),
        "{api:?} reused: {r}"
    );
    match expect.in_flight {
        // The SDK retried past the `409` and got the first payment.
        None => assert_eq!(
            id(&r["in_flight"]["second"]),
            id(&r["in_flight"]["first"]),
            "{api:?}: {r}"
        ),
        Some((class, status, code)) => assert!(
            raised(&r["in_flight"]["second"], class, status, code),
            "{api:?} in flight: {r}"
        ),
    }
    assert!(id(&r["in_flight"]["first"]).is_some(), "{api:?}: {r}");
    let (class, status, code) = expect.missing;
    assert!(
        raised(&r["missing_key"], class, status, code),
        "{api:?} missing: {r}"
    );
    let (class, status, code) = expect.down;
    assert!(
        raised(&r["store_down"], class, status, code),
        "{api:?} down: {r}"
    );
    // With `wait`, the duplicate gets the first payment.
    let waited = id(&r["in_flight_wait"]["first"]);
    assert!(waited.is_some(), "{api:?}: {r}");
    assert_eq!(id(&r["in_flight_wait"]["second"]), waited, "{api:?}: {r}");
    // The stored 500: the provider's own error, twice, from one execution.
    let (class, code) = expect.failed;
    for failed in r["stored_5xx"].as_array().unwrap() {
        assert!(raised(failed, class, 500, code), "{api:?} 5xx: {r}");
    }
    // The key of the API's maximum length went through.
    assert!(id(&r["longest_key"]).is_some(), "{api:?}: {r}");
    // Two credentials of tenant A: one payment; tenant B's same key: its own.
    let a1 = id(&r["tenants"]["a1"]);
    assert!(a1.is_some(), "{api:?}: {r}");
    assert_eq!(id(&r["tenants"]["a2"]), a1, "{api:?}: {r}");
    let b = id(&r["tenants"]["b"]);
    if expect.one_namespace {
        // One merchant: every token is its namespace.
        assert_eq!(b, a1, "{api:?}: {r}");
    } else {
        assert!(b.is_some() && b != a1, "{api:?}: {r}");
    }

    // What reached the provider: create, in flight, waited, the 500, the longest key, and
    // the tenants' two — each once; nothing of the refusals or the store outage.
    let executions = provider.executions();
    let payments = if expect.one_namespace { 6 } else { 7 };
    assert_eq!(executions.len(), payments, "{api:?}: {executions:?}\n{r}");
    let mut keys: Vec<_> = executions.iter().map(|e| e.key.clone()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(
        keys.len(),
        payments,
        "{api:?}: one key each: {executions:?}"
    );
    if let Some(max) = api.max_key_len() {
        assert!(
            executions
                .iter()
                .all(|e| e.key.as_ref().is_some_and(|k| k.len() <= max)),
            "{api:?}: a key over {max}: {executions:?}"
        );
    }
}

/// Each API's own answers: (SDK exception class, status, the API's code).
struct Expected {
    reused: (&'static str, u16, &'static str),
    /// `None`: the SDK retries a key in flight on its own and gets the payment.
    in_flight: Option<(&'static str, u16, &'static str)>,
    missing: (&'static str, u16, &'static str),
    down: (&'static str, u16, &'static str),
    /// The provider's own `500`, replayed: (class, code).
    failed: (&'static str, &'static str),
    /// All callers are one namespace (`static`): tenant B's key replays A's.
    one_namespace: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adyen_python_reads_the_adyen_preset() {
    let (r, provider) = run(Api::Adyen, "adyen", false).await;
    check(
        Api::Adyen,
        &r,
        &provider,
        &Expected {
            reused: ("AdyenAPIUnprocessableEntity", 422, "704"),
            in_flight: Some(("AdyenAPIUnprocessableEntity", 422, "704")),
            missing: ("AdyenAPIValidationError", 400, "missing-key"),
            down: ("AdyenAPIResponseError", 503, "store-unavailable"),
            failed: ("AdyenAPICommunicationError", "000"),
            one_namespace: false,
        },
    );
    // Adyen's transient-error header: retry the in-flight key, not the reused one.
    assert_eq!(
        r["in_flight"]["second"]["error"]["transient"], "true",
        "{r}"
    );
    assert!(r["reused"]["error"]["transient"].is_null(), "{r}");
}

/// PayPal with several merchants, the gateway setting `X-Tenant`: tenants apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paypal_python_reads_the_paypal_preset() {
    paypal(false).await;
}

/// PayPal as one merchant's sidecar (`static`), the SDK as it comes: every new SDK
/// instance's token still lands in the one namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paypal_python_one_merchant_across_tokens() {
    paypal(true).await;
}

async fn paypal(one_merchant: bool) {
    let (r, provider) = run(Api::PayPal, "paypal", one_merchant).await;
    check(
        Api::PayPal,
        &r,
        &provider,
        &Expected {
            reused: ("ErrorException", 422, "PAYPAL_REQUEST_ID_PREVIOUSLY_USED"),
            in_flight: Some(("ErrorException", 422, "PREVIOUS_REQUEST_IN_PROGRESS")),
            missing: ("ErrorException", 400, "MISSING_REQUIRED_PARAMETER"),
            down: ("ErrorException", 503, "STORE_UNAVAILABLE"),
            failed: ("ErrorException", "INTERNAL_SERVICE_ERROR"),
            one_namespace: one_merchant,
        },
    );
    // Every call was a new SDK instance with an OAuth token of its own.
    assert!(provider.tokens() >= 10, "{} tokens", provider.tokens());
    let tokens: std::collections::HashSet<_> = provider
        .executions()
        .into_iter()
        .filter_map(|e| e.authorization)
        .collect();
    assert!(tokens.len() >= 6, "{tokens:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_python_reads_the_checkout_preset() {
    let (r, provider) = run(Api::Checkout, "checkout", false).await;
    check(
        Api::Checkout,
        &r,
        &provider,
        &Expected {
            reused: ("CheckoutApiException", 422, "idempotency_key_reused"),
            in_flight: Some(("CheckoutApiException", 409, "request_in_progress")),
            missing: ("CheckoutApiException", 422, "idempotency_key_required"),
            down: ("CheckoutApiException", 503, "store_unavailable"),
            failed: ("CheckoutApiException", "internal_error"),
            one_namespace: false,
        },
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn square_python_reads_the_square_preset() {
    let (r, provider) = run(Api::Square, "square", false).await;
    check(
        Api::Square,
        &r,
        &provider,
        &Expected {
            reused: ("ApiError", 400, "IDEMPOTENCY_KEY_REUSED"),
            in_flight: None,
            missing: ("ApiError", 400, "MISSING_REQUIRED_PARAMETER"),
            down: ("ApiError", 503, "SERVICE_UNAVAILABLE"),
            failed: ("ApiError", "INTERNAL_SERVER_ERROR"),
            one_namespace: false,
        },
    );
    assert_eq!(r["longest_key_length"], 45, "{r}");
}
