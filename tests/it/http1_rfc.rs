//! What RFC 9112 and RFC 9110 say a server must refuse — or only lets a recipient repair —
//! is refused: each case is named after its clause, sent as raw bytes to a proxy in front
//! of a counting upstream, and must get its status as a problem document, the connection
//! closed, nothing reserved and not a byte sent upstream. Valid requests of every shape a
//! strict reading could get wrong go through, each exactly once and untouched.
//!
//! Why it matters: the gateway in front authenticates callers and sets `X-Client-Id`; a
//! message the gateway and the proxy frame differently smuggles a request past it.

use crate::support;

use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A keyed payment request with `fields` (CRLF-terminated lines) after its request line
/// and `body` after its head.
fn payment(fields: &str, body: &str) -> String {
    format!(
        "POST /payments HTTP/1.1\r\nidempotency-key: k-rfc\r\nx-client-id: shop-1\r\ncontent-type: application/json\r\n{fields}\r\n{body}"
    )
}

/// `{"amount":1}` in chunks whose size line is `size_line` for the first chunk.
fn chunked(size_line: &str) -> String {
    payment(
        "host: x\r\ntransfer-encoding: chunked\r\n",
        &format!("{size_line}\r\n{{\"amo\r\n7\r\nunt\":1}}\r\n0\r\n\r\n"),
    )
}

/// Each case: its clause, the bytes, and the status the proxy must answer with.
fn refused() -> Vec<(&'static str, String, u16)> {
    let long_target = format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70 * 1024));
    let many_fields: String = (0..101).map(|i| format!("x-f{i}: v\r\n")).collect();
    vec![
        // §2.2: lines end with CRLF; a bare LF or CR is not repaired.
        ("rfc9112_2_2_bare_lf_between_fields", payment("host: x\r\ndummy: x\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_2_2_bare_lf_after_request_line", "GET /orders/1 HTTP/1.1\nhost: x\r\n\r\n".into(), 400),
        ("rfc9112_2_2_bare_lf_ending_head", "GET /orders/1 HTTP/1.1\r\nhost: x\n\n".into(), 400),
        ("rfc9112_2_2_bare_cr_in_field", payment("host: x\r\ndummy: x\rcontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_2_2_whitespace_before_first_field", "GET /orders/1 HTTP/1.1\r\n host: x\r\n\r\n".into(), 400),
        // §3: method SP request-target SP HTTP-version, one space each.
        ("rfc9112_3_two_spaces", "GET  /orders/1 HTTP/1.1\r\nhost: x\r\n\r\n".into(), 400),
        ("rfc9112_3_tab_separator", "GET\t/orders/1 HTTP/1.1\r\nhost: x\r\n\r\n".into(), 400),
        ("rfc9112_3_trailing_space", "GET /orders/1 HTTP/1.1 \r\nhost: x\r\n\r\n".into(), 400),
        ("rfc9112_3_method_not_a_token", "G(T /orders/1 HTTP/1.1\r\nhost: x\r\n\r\n".into(), 400),
        ("rfc9112_3_no_version", "GET /orders/1\r\nhost: x\r\n\r\n".into(), 400),
        ("rfc9112_2_3_version_is_case_sensitive", "GET /orders/1 http/1.1\r\nhost: x\r\n\r\n".into(), 400),
        ("rfc9112_2_3_version_2_0", "GET /orders/1 HTTP/2.0\r\nhost: x\r\n\r\n".into(), 505),
        ("rfc9112_2_3_version_1_2", "GET /orders/1 HTTP/1.2\r\nhost: x\r\n\r\n".into(), 505),
        // §3.2: request-target forms per method.
        ("rfc9112_3_2_raw_non_ascii_target", "GET /caf\u{e9} HTTP/1.1\r\nhost: x\r\n\r\n".into(), 400),
        ("rfc9112_3_2_control_in_target", "GET /a\x01b HTTP/1.1\r\nhost: x\r\n\r\n".into(), 400),
        ("rfc9112_3_2_fragment_in_target", "GET /orders/1#frag HTTP/1.1\r\nhost: x\r\n\r\n".into(), 400),
        ("rfc9112_3_2_relative_target", "GET orders/1 HTTP/1.1\r\nhost: x\r\n\r\n".into(), 400),
        ("rfc9112_3_2_3_authority_form_on_get", "GET api.example:443 HTTP/1.1\r\nhost: x\r\n\r\n".into(), 400),
        ("rfc9112_3_2_4_asterisk_form_on_get", "GET * HTTP/1.1\r\nhost: x\r\n\r\n".into(), 400),
        ("rfc9112_3_2_2_absolute_form_userinfo", "GET http://user@api.example/orders/1 HTTP/1.1\r\nhost: api.example\r\n\r\n".into(), 400),
        ("rfc9112_3_2_2_absolute_form_not_http", "GET ftp://api.example/orders/1 HTTP/1.1\r\nhost: api.example\r\n\r\n".into(), 400),
        ("rfc9110_9_3_6_connect_is_not_tunnelled", "CONNECT api.example:443 HTTP/1.1\r\nhost: api.example:443\r\n\r\n".into(), 501),
        ("rfc9112_3_2_3_connect_with_a_path", payment("host: x\r\ncontent-length: 12\r\n", "{\"amount\":1}").replacen("POST", "CONNECT", 1), 400),
        ("rfc9110_7_8_upgrade_to_websocket", "GET /orders/1 HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n".into(), 501),
        // §3.2: exactly one valid Host on HTTP/1.1.
        ("rfc9112_3_2_no_host", payment("content-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_3_2_two_equal_hosts", payment("host: x\r\nhost: x\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_3_2_two_differing_hosts", payment("host: x\r\nhost: y\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_3_2_two_hosts_on_http_1_0", "GET /orders/1 HTTP/1.0\r\nhost: x\r\nhost: y\r\n\r\n".into(), 400),
        ("rfc9112_3_2_host_with_userinfo", payment("host: user@x\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_3_2_host_with_path", payment("host: x/payments\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_3_2_empty_host", payment("host:\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_3_2_host_list", payment("host: x, y\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_3_2_host_bad_port", payment("host: x:80a\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_3_2_host_with_space", payment("host: x y\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        // §5: field lines.
        ("rfc9112_5_1_space_before_colon", payment("host: x\r\ncontent-length : 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_5_1_tab_before_colon", payment("host: x\r\ncontent-length\t: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_5_2_obs_fold", payment("host: x\r\nx-note: a\r\n b\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9110_5_1_name_not_a_token", payment("host: x\r\nx(y): z\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9110_5_1_empty_name", payment("host: x\r\n: z\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_5_line_without_colon", payment("host: x\r\nno-colon\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9110_5_5_nul_in_value", payment("host: x\r\nx-note: a\0b\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9110_5_5_control_in_value", payment("host: x\r\nx-note: a\x0bb\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        ("rfc9110_5_5_del_in_value", payment("host: x\r\nx-note: a\x7fb\r\ncontent-length: 12\r\n", "{\"amount\":1}"), 400),
        // §6: framing.
        ("rfc9112_6_1_te_on_http_1_0", "POST /orders/1 HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n".into(), 400),
        ("rfc9112_6_1_te_and_cl", payment("host: x\r\ncontent-length: 12\r\ntransfer-encoding: chunked\r\n", "0\r\n\r\n"), 400),
        ("rfc9112_6_1_chunked_not_last", payment("host: x\r\ntransfer-encoding: chunked, gzip\r\n", "0\r\n\r\n"), 400),
        ("rfc9112_6_1_only_gzip", payment("host: x\r\ntransfer-encoding: gzip\r\n", "0\r\n\r\n"), 400),
        ("rfc9112_6_1_chunked_twice", payment("host: x\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n", "0\r\n\r\n"), 400),
        ("rfc9112_6_1_trailing_empty_coding", payment("host: x\r\ntransfer-encoding: chunked,\r\n", "0\r\n\r\n"), 400),
        ("rfc9112_6_1_coding_not_a_token", payment("host: x\r\ntransfer-encoding: chunked;q=1\r\n", "0\r\n\r\n"), 400),
        ("rfc9112_6_1_unknown_coding_before_chunked", payment("host: x\r\ntransfer-encoding: gzip, chunked\r\n", "0\r\n\r\n"), 501),
        ("rfc9112_6_3_differing_lengths", payment("host: x\r\ncontent-length: 12\r\ncontent-length: 13\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_6_3_length_list_differs", payment("host: x\r\ncontent-length: 12, 13\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_6_3_signed_length", payment("host: x\r\ncontent-length: +12\r\n", "{\"amount\":1}"), 400),
        ("rfc9112_6_3_length_with_space", payment("host: x\r\ncontent-length: 1 2\r\n", "{\"amount\":1}"), 400),
        // §7.1: the chunked body.
        ("rfc9112_7_1_bare_cr_in_chunk_size", chunked("5\r\r;ABCD"), 400),
        ("rfc9112_7_1_space_after_chunk_size", chunked("5 "), 400),
        ("rfc9112_7_1_tab_after_chunk_size", chunked("5\t"), 400),
        ("rfc9112_7_1_1_semicolon_without_name", chunked("5;"), 400),
        ("rfc9112_7_1_1_extension_name_not_a_token", chunked("5;a(b"), 400),
        ("rfc9112_7_1_1_extension_value_missing", chunked("5;a="), 400),
        ("rfc9112_7_1_1_unterminated_quoted_value", chunked("5;a=\"x"), 400),
        ("rfc9112_7_1_chunk_size_not_hex", chunked("0x5"), 400),
        ("rfc9112_7_1_chunk_size_too_long", chunked("00000000000000005"), 400),
        ("rfc9112_7_1_bare_lf_after_chunk_size", chunked("5\n"), 400),
        ("rfc9112_7_1_no_crlf_after_data", payment("host: x\r\ntransfer-encoding: chunked\r\n", "5\r\n{\"amoXX8\r\nunt\":1}\r\n0\r\n\r\n"), 400),
        ("rfc9112_7_1_2_obs_fold_in_trailer", payment("host: x\r\ntransfer-encoding: chunked\r\n", "c\r\n{\"amount\":1}\r\n0\r\nx-t: a\r\n b\r\n\r\n"), 400),
        ("rfc9112_7_1_2_trailer_name_not_a_token", payment("host: x\r\ntransfer-encoding: chunked\r\n", "c\r\n{\"amount\":1}\r\n0\r\nx t: a\r\n\r\n"), 400),
        // RFC 9110 §15.5.15, §15.5.20: limits.
        ("rfc9110_15_5_15_request_line_too_long", long_target, 414),
        ("rfc9110_15_5_20_too_many_fields", format!("GET /orders/1 HTTP/1.1\r\nhost: x\r\n{many_fields}\r\n"), 431),
    ]
}

/// Every refused case: its status as a problem document, the connection closed, nothing
/// reserved, no connection to the upstream ever opened. All cases run before any assert,
/// so one failure shows them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_rfcs_refuse_is_refused() {
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let mut failures = Vec::new();
    let mut reached = 0;
    for (name, bytes, status) in refused() {
        let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
        // The peer may close before reading all of a large request: that is the answer.
        let _ = conn.write_all(bytes.as_bytes()).await;
        let mut buf = Vec::new();
        let Some(answer) = read_answer(&mut conn, &mut buf, false).await else {
            failures.push(format!("{name}: no answer"));
            continue;
        };
        let problem = answer.header("content-type") == Some("application/problem+json")
            && serde_json::from_slice::<serde_json::Value>(&answer.body)
                .is_ok_and(|doc| doc["detail"].as_str().is_some_and(|d| !d.is_empty()));
        if answer.status != status || !problem {
            failures.push(format!(
                "{name}: {} {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            ));
        } else if !closed(&mut conn).await {
            failures.push(format!("{name}: the connection stayed open"));
        }
        if upstream.connections() > reached {
            failures.push(format!("{name}: reached the upstream"));
            reached = upstream.connections();
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(upstream.connections(), 0);
    assert_eq!(upstream.executions(), 0);
    assert_eq!(db.rows().await, 0, "nothing reserved");
    proxy.stop().await;
}

/// A valid case: its name, the request, the target the upstream sees, a field it sees
/// (name, value), and the body it sees.
type Passing<'a> = (&'a str, String, &'a str, (&'a str, &'a str), &'a str);

/// Requests a strict reading could get wrong but that are valid: each reaches the upstream
/// once, as the method, target, fields and body the client sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_requests_go_through_untouched() {
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let long_value = "v".repeat(30 * 1024);
    let cases: Vec<Passing<'_>> = vec![
        ("empty_line_before_request_line", "\r\nGET /orders/1 HTTP/1.1\r\nhost: x\r\n\r\n".into(), "/orders/1", ("x-forwarded-host", "x"), ""),
        ("http_1_0_without_host", "GET /orders/2 HTTP/1.0\r\n\r\n".into(), "/orders/2", ("x-forwarded-proto", "http"), ""),
        ("percent_encoded_target", "GET /orders/%41b?q=%20x&r=a%2Fb HTTP/1.1\r\nhost: x\r\n\r\n".into(), "/orders/%41b?q=%20x&r=a%2Fb", ("x-forwarded-host", "x"), ""),
        ("absolute_form_authority_wins", "GET http://api.example:8443/orders/3?x=1 HTTP/1.1\r\nhost: other\r\n\r\n".into(), "/orders/3?x=1", ("x-forwarded-host", "api.example:8443"), ""),
        ("host_ipv6_with_port", "GET /orders/4 HTTP/1.1\r\nhost: [::1]:8080\r\n\r\n".into(), "/orders/4", ("x-forwarded-host", "[::1]:8080"), ""),
        ("obs_text_in_a_value", "GET /orders/5 HTTP/1.1\r\nhost: x\r\nx-name: caf\u{e9}\r\n\r\n".into(), "/orders/5", ("x-name", "caf\u{e9}"), ""),
        ("tab_in_a_value_and_no_space_after_colon", "GET /orders/6 HTTP/1.1\r\nhost:x\r\nx-note:a\tb \r\n\r\n".into(), "/orders/6", ("x-note", "a\tb"), ""),
        ("long_valid_head", format!("GET /orders/7 HTTP/1.1\r\nhost: x\r\nx-long: {long_value}\r\n\r\n"), "/orders/7", ("x-long", &long_value), ""),
        ("chunked_with_extensions_and_trailer", "POST /orders/8 HTTP/1.1\r\nhost: x\r\ntransfer-encoding: , chunked\r\n\r\n3;name=val ; q=\"a \\\" b\"\r\nabc\r\n2;x\r\nde\r\n0;end\r\nx-trailer: t\r\n\r\n".into(), "/orders/8", ("x-forwarded-host", "x"), "abcde"),
        ("equal_lengths_listed", "POST /orders/9 HTTP/1.1\r\nhost: x\r\ncontent-length: 3, 3\r\n\r\nabc".into(), "/orders/9", ("x-forwarded-host", "x"), "abc"),
        ("upgrade_h2c_is_ignored", "GET /orders/10 HTTP/1.1\r\nhost: x\r\nconnection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n".into(), "/orders/10", ("x-forwarded-host", "x"), ""),
        ("extension_method", "PURGE /orders/11 HTTP/1.1\r\nhost: x\r\n\r\n".into(), "/orders/11", ("x-forwarded-host", "x"), ""),
    ];
    let mut failures = Vec::new();
    for (i, (name, request, path, (field, value), body)) in cases.iter().enumerate() {
        let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let answer = read_answer(&mut conn, &mut buf, false).await;
        let seen = upstream.seen();
        let Some(answer) = answer.filter(|a| a.status != 400 && a.status < 500) else {
            failures.push(format!("{name}: refused"));
            continue;
        };
        let Some(last) = seen.get(i).filter(|_| seen.len() == i + 1) else {
            failures.push(format!(
                "{name}: {} upstream requests, answer {}",
                seen.len(),
                answer.status
            ));
            break;
        };
        let got = last.headers.get(*field).map(|v| v.as_bytes().to_vec());
        if last.path != *path
            || got.as_deref() != Some(value.as_bytes())
            || last.body != body.as_bytes()
        {
            failures.push(format!("{name}: upstream saw {last:?}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    proxy.stop().await;
}

/// `OPTIONS *` asks about the server as a whole; it reaches the upstream as `*`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_asterisk_goes_through() {
    let db = Backend::embedded();
    let upstream = Upstream::spawn(Behavior::default()).await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;
    let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
    conn.write_all(b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let answer = read_answer(&mut conn, &mut buf, false).await.unwrap();
    assert_eq!(
        answer.status,
        201,
        "{:?}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(upstream.seen().len(), 1);
    assert_eq!(upstream.seen()[0].path, "*");
    proxy.stop().await;
}
