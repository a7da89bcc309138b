//! A plain HTTP client for the tests and what it saw of an answer.

use std::net::SocketAddr;
use std::time::Duration;

use super::*;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// A client for a proxy at `addr`.
pub fn client_for(addr: SocketAddr) -> TestClient {
    TestClient::at(addr)
}

/// A response as the client saw it.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| panic!("not JSON: {:?}", self.body))
    }

    /// The problem document's `detail`.
    pub fn detail(&self) -> String {
        self.json()["detail"]
            .as_str()
            .unwrap_or_else(|| panic!("no detail: {self:?}"))
            .to_owned()
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    pub fn is_problem(&self) -> bool {
        self.headers
            .get("content-type")
            .is_some_and(|v| v == "application/problem+json")
    }
}

/// A plain HTTP client for the tests.
#[derive(Clone)]
pub struct TestClient {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl TestClient {
    pub fn new(proxy: &TestProxy) -> Self {
        Self::at(proxy.addr)
    }

    pub fn at(addr: SocketAddr) -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: format!("http://{addr}"),
        }
    }

    /// Like `send`, but a failed connection is an `Err` instead of a panic.
    pub async fn try_send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Reply, String> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
        let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        self.try_send(method, path, headers, body)
            .await
            .expect("proxy answers")
    }

    /// Sends `n` POSTs at once, each with its own key (`{prefix}{i}`), and returns their
    /// replies.
    pub async fn post_each_key_at_once(
        &self,
        n: usize,
        path: &str,
        client_id: &str,
        prefix: &str,
        body: &str,
    ) -> Vec<Reply> {
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..n {
            let (this, path, client_id, key, body) = (
                self.clone(),
                path.to_owned(),
                client_id.to_owned(),
                format!("{prefix}{i}"),
                body.to_owned(),
            );
            tasks.spawn(async move { this.post(&path, &client_id, &key, &body).await });
        }
        tasks.join_all().await
    }

    /// Retries `post` while it answers 409 (a lease still held), for up to 20 s.
    pub async fn post_until_settled(
        &self,
        path: &str,
        client: &str,
        key: &str,
        body: &str,
    ) -> Reply {
        eventually(Duration::from_secs(20), || async {
            let reply = self.post(path, client, key, body).await;
            (reply.status != 409).then_some(reply)
        })
        .await
        .unwrap_or_else(|| panic!("{key} still answered 409 after 20 s"))
    }

    /// `POST path` with a JSON body, a key and a client id.
    pub async fn post(&self, path: &str, client: &str, key: &str, body: &str) -> Reply {
        self.send(
            "POST",
            path,
            &[
                ("content-type", "application/json"),
                ("idempotency-key", key),
                ("x-client-id", client),
            ],
            body,
        )
        .await
    }
}
