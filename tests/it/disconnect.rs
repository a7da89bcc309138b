//! A client that goes away cancels nothing: the upstream call and the completion run to
//! the end, and the retry gets the stored answer.

use crate::support;
use idemproxy::store::KeyState;

use std::time::Duration;

use support::*;
use tokio::io::AsyncWriteExt;

const BODY: &str = r#"{"amount":100,"currency":"RUB","recipient":"shop-1","purpose":"order-1"}"#;

/// The client drops its connection while the upstream works; a retry after the upstream
/// finished is a replay of the stored answer (not 409), and the upstream ran once.
async fn client_disconnect_cancels_nothing(db: Backend) {
    let upstream = Upstream::spawn(Behavior {
        delay: Duration::from_millis(700),
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::spawn(PAYMENTS, &upstream, &db).await;

    let mut raw = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let request = format!(
        "POST /payments HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nidempotency-key: gone\r\nx-client-id: shop-1\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    raw.write_all(request.as_bytes()).await.unwrap();
    // Wait until the upstream is working on it, then hang up.
    let started = eventually(Duration::from_secs(10), || async {
        (upstream.executions() == 1).then_some(())
    })
    .await;
    assert!(started.is_some(), "the request reached the upstream");
    drop(raw);

    let client = TestClient::new(&proxy);
    let replay = eventually(Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            let reply = client.post("/payments", "shop-1", "gone", BODY).await;
            (reply.status != 409).then_some(reply)
        }
    })
    .await
    .expect("the retry is answered from the store well before the 30 s lease runs out");
    assert_eq!(replay.status, 201, "{replay:?}");
    assert!(replay.replayed());
    assert_eq!(upstream.executions(), 1);
    let row = db.lookup("shop-1", "gone").await.unwrap();
    assert_eq!(row.state, KeyState::Done);
    assert_eq!(row.response_status, Some(201));
    proxy.stop().await;
}

on_both_stores!(client_disconnect_cancels_nothing);
