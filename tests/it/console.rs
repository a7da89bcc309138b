//! The operator's console, in a real browser (Debian's headless Chromium through
//! ChromeDriver): sign in with a named token, watch an ambiguous upstream failure appear as
//! an unresolved key, read its story, resolve it with the provider's answer, and see the
//! client's retry get that answer — by keyboard where a person would use one, with every
//! control labelled, and screenshots of each page kept in
//! `target/tmp/console-screenshots/`. Beside it, what keeps the console safe: the cookie,
//! CSRF, the policy headers, and a listener without a token serving no console.

use crate::support;

use std::time::Duration;

use sha2::Digest;
use support::proxies::ProxyProcess;
use support::webdriver::{Browser, ENTER, TAB};
use support::*;

const ALICE: &str = "alice-console-token-7f3a9c";
const PLAIN: &str = "plain-admin-token-5b21e8";
const PAID: &str = r#"{"id":"pay_81","status":"succeeded"}"#;

fn config() -> String {
    let alice: String = sha2::Sha256::digest(ALICE.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("admin_token: {PLAIN}\nadmin_tokens:\n  - name: alice\n    sha256: {alice}\n{PAYMENTS}")
        .replace(
            "    require_key: true\n",
            "    require_key: true\n    ambiguous_statuses: [502]\n    takeover: never\n    lease: 3s\n",
        )
}

/// Controls with no label a screen reader could read (inputs, text areas, buttons).
const UNLABELLED: &str = "return Array.from(document.querySelectorAll('input:not([type=hidden]), textarea, select, button'))\
    .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !(e.tagName === 'BUTTON' && e.textContent.trim()))\
    .map(e => e.outerHTML);";

async fn no_unlabelled_controls(browser: &Browser) {
    let found = browser.script(UNLABELLED).await;
    assert_eq!(
        found,
        serde_json::json!([]),
        "unlabelled controls on {}",
        browser.url().await
    );
}

/// Presses Tab until the focused element's text (or id) is `want`; fails after 30.
async fn tab_to(browser: &Browser, want: &str) {
    for _ in 0..30 {
        browser.keys(TAB).await;
        let e = browser.focused().await;
        let text = browser.text_of(&e).await;
        let id = browser.script("return document.activeElement.id").await;
        if text.trim() == want || id == want {
            return;
        }
    }
    panic!("Tab never reached {want:?} on {}", browser.url().await);
}

/// The whole operator flow, in the browser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resolves_an_unresolved_key_in_the_browser() {
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior {
        status: 502,
        ..Default::default()
    })
    .await;
    let proxy = ProxyProcess::spawn(&config(), &upstream, &db).await;
    let console = format!("http://{}", proxy.admin);
    let browser = Browser::start("flow").await;

    // Signing in, keyboard only: the token field, the token, Enter.
    browser.go(&format!("{console}/")).await;
    assert!(
        browser.title().await.starts_with("Sign in"),
        "{}",
        browser.title().await
    );
    no_unlabelled_controls(&browser).await;
    browser.screenshot("1-sign-in").await;
    tab_to(&browser, "token").await;
    browser.keys(&format!("wrong-token{ENTER}")).await;
    browser.find("#login-problem").await;
    tab_to(&browser, "token").await;
    browser.keys(&format!("{ALICE}{ENTER}")).await;
    browser.find("[data-figure=unresolved]").await;
    assert!(browser.text().await.contains("Signed in as alice"));
    assert!(
        !browser.url().await.contains(ALICE),
        "the token is in no URL"
    );
    let cookies = browser.cookies().await;
    assert_eq!(cookies.len(), 1, "{cookies:?}");
    assert_eq!(cookies[0]["httpOnly"], true);
    assert_eq!(cookies[0]["sameSite"], "Strict");
    assert!(!cookies[0]["value"].as_str().unwrap().contains(ALICE));
    let unresolved = browser.find("[data-figure=unresolved]").await;
    assert_eq!(browser.text_of(&unresolved).await, "0");

    // An ambiguous upstream answer (a gateway's 502) keeps the key; once its lease runs
    // out it is unresolved, and the overview shows it without a reload.
    let client = TestClient::at(proxy.addr);
    let first = client
        .post("/payments", "shop-1", "order-81", PAYMENT_BODY)
        .await;
    assert_eq!(first.status, 502);
    tokio::time::sleep(Duration::from_millis(3300)).await;
    let retry = client
        .post("/payments", "shop-1", "order-81", PAYMENT_BODY)
        .await;
    assert!(
        retry.status.is_client_error() || retry.status.is_server_error(),
        "{retry:?}"
    );
    assert_eq!(upstream.executions(), 1);
    let shown = eventually(Duration::from_secs(15), || async {
        (browser.text_of(&unresolved).await == "1").then_some(())
    })
    .await;
    assert!(
        shown.is_some(),
        "the overview's refresh shows the unresolved key"
    );
    no_unlabelled_controls(&browser).await;
    browser.screenshot("2-overview").await;

    // To the list and the key's story, by keyboard.
    tab_to(&browser, "Unresolved keys").await;
    browser.keys(ENTER).await;
    browser.find("table.keys").await;
    assert!(browser.url().await.ends_with("/console/unresolved"));
    let text = browser.text().await;
    assert!(
        text.contains("order-81") && text.contains("shop-1") && text.contains("a retry or you"),
        "{text}"
    );
    no_unlabelled_controls(&browser).await;
    browser.screenshot("3-unresolved").await;
    tab_to(&browser, "order-81").await;
    browser.keys(ENTER).await;
    browser.find(".timeline").await;
    let text = browser.text().await;
    assert!(text.contains("unresolved"), "{text}");
    assert!(text.contains("Lease ran out"), "{text}");
    assert!(
        text.contains("shop-1:order-81"),
        "the derived key sent upstream: {text}"
    );
    no_unlabelled_controls(&browser).await;
    browser.screenshot("4-key").await;

    // Resolve with the provider's answer: the form, the confirmation, the result.
    let body = browser.find("#body").await;
    browser.click(&body).await;
    browser.type_into(&body, PAID).await;
    browser.keys(TAB).await;
    let review = browser.focused().await;
    assert_eq!(browser.text_of(&review).await, "Review: store this answer");
    browser.keys(ENTER).await;
    browser.find(".consequence").await;
    let text = browser.text().await;
    assert!(
        text.contains("next retry") && text.contains("replayed"),
        "{text}"
    );
    assert_eq!(
        upstream.executions(),
        1,
        "nothing happens before confirming"
    );
    browser.screenshot("5-confirm").await;
    tab_to(&browser, "Store the answer").await;
    browser.keys(ENTER).await;
    browser.find(".done").await;
    assert!(browser.text().await.contains("Resolved: stored status 201"));
    browser.screenshot("6-resolved").await;

    // The client's retry gets the operator's answer; nothing executed again.
    let after = client
        .post("/payments", "shop-1", "order-81", PAYMENT_BODY)
        .await;
    assert_eq!(after.status, 201, "{after:?}");
    assert_eq!(&after.body[..], PAID.as_bytes());
    assert!(after.replayed());
    assert_eq!(upstream.executions(), 1);
    let log = proxy.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("resolved by an operator") && l.contains("alice")),
        "an audit line names the token: {log}"
    );
    assert!(!log.contains(ALICE), "the token is never logged");

    // The story now says answered — found through the lookup form, by keyboard; the body
    // only on request.
    tab_to(&browser, "Look up a key").await;
    browser.keys(ENTER).await;
    browser.find("form.lookup").await;
    no_unlabelled_controls(&browser).await;
    browser.screenshot("7-look-up").await;
    tab_to(&browser, "client").await;
    browser.keys(&format!("shop-1{TAB}order-81{ENTER}")).await;
    browser.find(".timeline").await;
    let text = browser.text().await;
    assert!(
        text.contains("answered") && text.contains("Stored status"),
        "{text}"
    );
    assert!(!text.contains("pay_81"), "the body only on request");
    let show = browser.find("a[href*='body=1']").await;
    browser.click(&show).await;
    let pre = browser.find("pre.body").await;
    assert_eq!(browser.text_of(&pre).await, PAID);
    browser.screenshot("8-answered").await;

    // Evicting says what the next retry gets, and then it executes afresh.
    let evict = browser.find("#evict + p + form button").await;
    browser.click(&evict).await;
    let consequence = browser.find(".consequence").await;
    assert!(
        browser
            .text_of(&consequence)
            .await
            .contains("executed again upstream")
    );
    let confirm = browser.find("button.danger").await;
    browser.click(&confirm).await;
    browser.find(".done").await;
    upstream.set(Behavior::default());
    let fresh = client
        .post("/payments", "shop-1", "order-81", PAYMENT_BODY)
        .await;
    assert_eq!(fresh.status, 201);
    assert!(!fresh.replayed());
    assert_eq!(upstream.executions(), 2);
    assert!(
        proxy
            .log_text()
            .lines()
            .any(|l| l.contains("evicted by an operator") && l.contains("alice"))
    );

    // Signing out ends the session: its cookie opens nothing any more.
    let cookie = format!(
        "idemproxy_console={}",
        cookies[0]["value"].as_str().unwrap()
    );
    let admin = TestClient::at(proxy.admin);
    assert_eq!(
        admin
            .send("GET", "/console/unresolved", &[("cookie", &cookie)], "")
            .await
            .status,
        200
    );
    let out = browser.find("form.logout button").await;
    browser.click(&out).await;
    browser.find("#token").await;
    assert_eq!(
        admin
            .send("GET", "/console/unresolved", &[("cookie", &cookie)], "")
            .await
            .status,
        401
    );
    browser.quit().await;
}

/// What a browser page must not be able to do: post without the session's CSRF token or
/// from another origin, use the session cookie for the API, or run in a frame or with
/// inline script; and a listener without a token serves no console.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_refuses_what_a_page_must_not_do() {
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = ProxyProcess::spawn(&config(), &upstream, &db).await;
    let admin = TestClient::at(proxy.admin);
    let form = [("content-type", "application/x-www-form-urlencoded")];

    // A browser gets the sign-in page; anything else a problem document, as every error.
    let browser_page = admin.send("GET", "/", &[("accept", "text/html")], "").await;
    assert_eq!(browser_page.status, 401);
    assert_eq!(
        browser_page.headers["content-type"],
        "text/html; charset=utf-8"
    );
    let page = admin.send("GET", "/", &[], "").await;
    assert_eq!(page.status, 401);
    assert!(page.is_problem(), "{page:?}");
    assert!(page.detail().contains("sign in"), "{page:?}");
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("default-src 'none'")
            && csp.contains("frame-ancestors 'none'")
            && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(page.headers["x-frame-options"], "DENY");
    assert_eq!(page.headers["cache-control"], "no-store");

    let wrong = admin
        .send("POST", "/console/login", &form, "token=nope")
        .await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.headers.get("set-cookie").is_none());
    let cross = [form[0], ("origin", "https://evil.example")];
    let refused = admin
        .send("POST", "/console/login", &cross, &format!("token={PLAIN}"))
        .await;
    assert_eq!(refused.status, 403, "a login posted from another site");
    let ok = admin
        .send("POST", "/console/login", &form, &format!("token={PLAIN}"))
        .await;
    assert_eq!(ok.status, 303);
    let set = ok.headers["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap().to_owned();

    // The key must exist for the action to reach the CSRF check's other side.
    let client = TestClient::at(proxy.addr);
    assert_eq!(
        client
            .post("/payments", "shop-1", "k1", PAYMENT_BODY)
            .await
            .status,
        201
    );
    let evict = "action=evict&client=shop-1&key=k1&confirm=yes";
    let with_cookie = [form[0], ("cookie", cookie.as_str())];
    let no_csrf = admin
        .send("POST", "/console/action", &with_cookie, evict)
        .await;
    assert_eq!(no_csrf.status, 403, "no CSRF token");
    assert!(
        no_csrf.is_problem()
            && no_csrf.json()["type"]
                .as_str()
                .unwrap()
                .ends_with("csrf-token-mismatch")
    );
    let page = admin
        .send(
            "GET",
            "/console/key?client=shop-1&key=k1",
            &with_cookie[1..],
            "",
        )
        .await;
    let html = String::from_utf8_lossy(&page.body).into_owned();
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned();
    let cross = [
        form[0],
        ("cookie", cookie.as_str()),
        ("origin", "https://evil.example"),
    ];
    let forged = admin
        .send(
            "POST",
            "/console/action",
            &cross,
            &format!("{evict}&csrf={csrf}"),
        )
        .await;
    assert_eq!(forged.status, 403, "another origin, even with the token");
    let site = [
        form[0],
        ("cookie", cookie.as_str()),
        ("sec-fetch-site", "cross-site"),
    ];
    let forged = admin
        .send(
            "POST",
            "/console/action",
            &site,
            &format!("{evict}&csrf={csrf}"),
        )
        .await;
    assert_eq!(forged.status, 403, "a cross-site fetch");
    assert!(
        db.lookup("shop-1", "k1").await.is_some(),
        "nothing was evicted"
    );
    let done = admin
        .send(
            "POST",
            "/console/action",
            &with_cookie,
            &format!("{evict}&csrf={csrf}"),
        )
        .await;
    assert_eq!(done.status, 200);
    assert!(db.lookup("shop-1", "k1").await.is_none());

    // The cookie is the console's: the API still wants the bearer token.
    let api = admin
        .send("GET", "/admin/stuck", &with_cookie[1..], "")
        .await;
    assert_eq!(api.status, 401);
    drop(proxy);

    // No token configured: the API is open to loopback, the console is closed.
    let open = ProxyProcess::spawn(PAYMENTS, &upstream, &db).await;
    let admin = TestClient::at(open.admin);
    let closed = admin.send("GET", "/", &[], "").await;
    assert_eq!(closed.status, 403);
    assert!(String::from_utf8_lossy(&closed.body).contains("admin_token"));
    let login = admin.send("POST", "/console/login", &form, "token=").await;
    assert_eq!(login.status, 403);
    assert_eq!(admin.send("GET", "/admin/stuck", &[], "").await.status, 200);
}

/// Signs in to the console at `admin` with `token`; the session cookie.
async fn sign_in(admin: std::net::SocketAddr, token: &str) -> String {
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let ok = TestClient::at(admin)
        .send("POST", "/console/login", &form, &format!("token={token}"))
        .await;
    assert_eq!(ok.status, 303, "{ok:?}");
    let set = ok.headers["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_owned()
}

/// A stored body is shown only on request, never when it is sealed (encryption at rest) or
/// its route says `console_body: false`; where neither holds it is shown, so the check can
/// fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_never_shows_a_sealed_or_withheld_body() {
    let db = Backend::postgres().await;
    let upstream = Upstream::spawn(Behavior::default()).await;
    let dir = TempDir::new("console-sealed");
    let k1 = support::at_rest::key_file(&dir, "k1", 1);
    let sealed = format!(
        "admin_token: {PLAIN}\n{PAYMENTS}encryption:\n  keys:\n    k1: {{ file: \"{}\" }}\n  active: k1\n",
        k1.display()
    );
    let withheld = format!("admin_token: {PLAIN}\n{PAYMENTS}").replace(
        "    require_key: true\n",
        "    require_key: true\n    console_body: false\n",
    );
    for (yaml, path, key, shown) in [
        (sealed.as_str(), "/payments", "p-1", "Sealed with"),
        (withheld.as_str(), "/payments", "p-2", "console_body: false"),
        (withheld.as_str(), "/orders/1", "o-1", "charge_id"),
    ] {
        let proxy = TestProxy::spawn(yaml, &upstream, &db).await;
        let paid = TestClient::new(&proxy)
            .post(path, "shop-1", key, PAYMENT_BODY)
            .await;
        assert_eq!(paid.status, 201, "{paid:?}");
        let cookie = sign_in(proxy.admin, PLAIN).await;
        let page = TestClient::at(proxy.admin)
            .send(
                "GET",
                &format!("/console/key?client=shop-1&key={key}&body=1"),
                &[("cookie", &cookie), ("accept", "text/html")],
                "",
            )
            .await;
        assert_eq!(page.status, 200, "{page:?}");
        let html = String::from_utf8_lossy(&page.body).into_owned();
        assert!(html.contains(shown), "{key}: {html}");
        if shown != "charge_id" {
            assert!(
                !html.contains("charge_id"),
                "{key}: the body is not shown: {html}"
            );
        }
        if shown == "Sealed with" {
            assert!(
                !html.contains("/payments/1"),
                "nor a sealed answer's headers"
            );
        } else {
            assert!(
                html.contains("/payments/1"),
                "a clear answer's headers are shown"
            );
        }
        proxy.stop().await;
    }
}
