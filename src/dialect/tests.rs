#![allow(clippy::unwrap_used)]

use super::*;

fn said(code: &str, status: StatusCode, retry_after: Option<u64>, helps: bool) -> Said<'_> {
    Said {
        status,
        kind: "urn:idemproxy:problem:x",
        code,
        category: "",
        title: "T",
        detail: "said \"so\"",
        retry_after,
        retry_helps: helps,
    }
}

#[test]
fn templates_render_json_or_are_refused() {
    let t = Template::parse(
        r#"{"errorCode": "{code}", "error": {"message": "{detail}", "status": {status}, "retryIn": {retry_after}}, "lit": "{x-1}", "o": {}}"#,
        None,
    )
    .unwrap();
    let body = t.render(&said(
        "key-reused",
        StatusCode::UNPROCESSABLE_ENTITY,
        None,
        false,
    ));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["errorCode"], "key-reused");
    assert_eq!(v["error"]["message"], "said \"so\"");
    assert_eq!(v["error"]["status"], 422);
    assert!(v["error"]["retryIn"].is_null());
    for bad in [
        r#"{"code": {code}}"#,
        r#"{"code": "{code}""#,
        r#"{"code": "{cdoe}"}"#,
        r#"{"s": "{status}"#,
    ] {
        assert!(Template::parse(bad, None).is_err(), "{bad}");
    }
    assert!(Template::parse("{}", Some("bad\nvalue")).is_err());
}

#[test]
fn stripe_types_follow_the_sdks() {
    let r = Dialect::stripe().render(&said(
        "key-reused",
        StatusCode::UNPROCESSABLE_ENTITY,
        None,
        false,
    ));
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["type"], "idempotency_error");
    assert_eq!(r.should_retry, Some(false));
    let r = Dialect::stripe().render(&said("in-progress", StatusCode::CONFLICT, Some(1), true));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        (r.status, r.should_retry),
        (StatusCode::CONFLICT, Some(true))
    );
    assert_eq!(v["error"]["code"], "idempotency_key_in_use");
    let r = Dialect::stripe().render(&said(
        "store-unavailable",
        StatusCode::SERVICE_UNAVAILABLE,
        Some(1),
        true,
    ));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["type"], "api_error");
    assert_eq!(v["error"]["code"], "store_unavailable");
}

/// Every preset's text renders JSON (a preset that did not would answer in problem
/// documents instead).
#[test]
fn presets_are_templates_that_parse() {
    for preset in Preset::ALL {
        let d = Dialect::preset(preset);
        assert_eq!(d.name(), preset.name());
        assert!(
            !matches!(d.shape(), Shape::Problem),
            "{}: its template does not parse",
            preset.name()
        );
        assert_eq!(Preset::named(preset.name()), Some(preset));
    }
}

fn json(r: &Rendered) -> serde_json::Value {
    serde_json::from_slice(&r.body).unwrap()
}

/// Each API's own codes where its documentation has them (docs/apis/).
#[test]
fn presets_answer_in_each_apis_codes() {
    let reused = said("key-reused", StatusCode::UNPROCESSABLE_ENTITY, None, false);
    let busy = said("in-progress", StatusCode::CONFLICT, Some(1), true);
    let down = said(
        "store-unavailable",
        StatusCode::SERVICE_UNAVAILABLE,
        Some(1),
        true,
    );

    let square = Dialect::preset(Preset::Square);
    let r = square.render(&reused);
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(json(&r)["errors"][0]["code"], "IDEMPOTENCY_KEY_REUSED");
    assert_eq!(json(&r)["errors"][0]["category"], "INVALID_REQUEST_ERROR");
    let r = square.render(&down);
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json(&r)["errors"][0]["category"], "API_ERROR");
    assert_eq!(json(&r)["errors"][0]["code"], "SERVICE_UNAVAILABLE");
    assert_eq!(square.render(&busy).status, StatusCode::CONFLICT);

    let adyen = Dialect::preset(Preset::Adyen);
    let r = adyen.render(&busy);
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json(&r)["errorCode"], "704");
    assert_eq!(json(&r)["status"], 422);
    assert!(
        r.headers
            .iter()
            .any(|(n, v)| n == "transient-error" && v == "true")
    );
    let r = adyen.render(&reused);
    assert_eq!(json(&r)["errorCode"], "704");
    assert!(
        r.headers.is_empty(),
        "a reused key is final: {:?}",
        r.headers
    );

    let paypal = Dialect::preset(Preset::PayPal);
    let r = paypal.render(&reused);
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json(&r)["name"], "UNPROCESSABLE_ENTITY");
    assert_eq!(
        json(&r)["details"][0]["issue"],
        "PAYPAL_REQUEST_ID_PREVIOUSLY_USED"
    );
    assert_eq!(json(&paypal.render(&down))["name"], "SERVICE_UNAVAILABLE");

    let checkout = Dialect::preset(Preset::Checkout);
    let r = checkout.render(&busy);
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(json(&r)["error_codes"][0], "request_in_progress");
    assert_eq!(
        json(&checkout.render(&reused))["error_type"],
        "request_invalid"
    );
}

/// `outcomes:` go over a preset field by field: what is not given stays the preset's.
#[test]
fn overrides_go_over_a_preset_field_by_field() {
    let d = Dialect::preset(Preset::Square).with_overrides(vec![(
        "in-progress".into(),
        Answer {
            status: Some(StatusCode::TOO_MANY_REQUESTS),
            category: Some("RATE_LIMIT_ERROR".into()),
            headers: vec![(
                HeaderName::from_static("x-why"),
                HeaderValue::from_static("busy"),
            )],
            ..Answer::default()
        },
    )]);
    let r = d.render(&said("in-progress", StatusCode::CONFLICT, Some(1), true));
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let v = json(&r);
    assert_eq!(v["errors"][0]["category"], "RATE_LIMIT_ERROR");
    assert_eq!(
        v["errors"][0]["code"], "CONFLICT",
        "the preset's code stays"
    );
    assert_eq!(r.headers.len(), 1);
    // Another outcome is untouched.
    let r = d.render(&said(
        "key-reused",
        StatusCode::UNPROCESSABLE_ENTITY,
        None,
        false,
    ));
    assert_eq!(json(&r)["errors"][0]["code"], "IDEMPOTENCY_KEY_REUSED");
    // Over problem documents: the status and the detail.
    let d = Dialect::default().with_overrides(vec![(
        "key-reused".into(),
        Answer {
            status: Some(StatusCode::CONFLICT),
            message: Some("used".into()),
            ..Answer::default()
        },
    )]);
    let r = d.render(&said(
        "key-reused",
        StatusCode::UNPROCESSABLE_ENTITY,
        None,
        false,
    ));
    assert_eq!(
        (r.status, json(&r)["status"].as_u64()),
        (StatusCode::CONFLICT, Some(409))
    );
    assert_eq!(json(&r)["detail"], "used");
}
