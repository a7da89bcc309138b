//! Raw HTTP/1 on a socket, for tests that must send bytes no client library would: reading
//! one answer however it is framed, and telling whether the proxy closed the connection.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// One answer as read off the wire.
#[derive(Debug)]
pub struct Raw {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Raw {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one answer from `buf` (topping it up from `conn`), framed by its length, its
/// chunks, or the connection's end. `head_only` for answers to HEAD.
pub async fn read_answer(conn: &mut TcpStream, buf: &mut Vec<u8>, head_only: bool) -> Option<Raw> {
    let (status, headers, len) = loop {
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut fields);
        if let httparse::Status::Complete(len) = resp.parse(buf).unwrap() {
            let headers = resp
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_owned(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect::<Vec<_>>();
            break (resp.code.unwrap(), headers, len);
        }
        if fill(conn, buf).await? == 0 {
            return None;
        }
    };
    buf.drain(..len);
    let mut raw = Raw {
        status,
        headers,
        body: Vec::new(),
    };
    if head_only || status == 100 || status == 204 || status == 304 {
        return Some(raw);
    }
    if let Some(n) = raw.header("content-length") {
        let n: usize = n.parse().unwrap();
        while buf.len() < n {
            assert!(fill(conn, buf).await? > 0, "closed inside a body");
        }
        raw.body = buf.drain(..n).collect();
    } else if raw.header("transfer-encoding") == Some("chunked") {
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                assert!(fill(conn, buf).await? > 0);
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).unwrap(), 16).unwrap();
            while buf.len() < line_end + 2 + size + 2 {
                assert!(fill(conn, buf).await? > 0);
            }
            raw.body
                .extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    } else {
        while fill(conn, buf).await? > 0 {}
        raw.body = std::mem::take(buf);
    }
    Some(raw)
}

/// Reads what comes next into `buf`: how much (0 at the end), `None` on a time-out.
pub async fn fill(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    let mut chunk = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut chunk))
        .await
        .ok()?
        .ok()?;
    buf.extend_from_slice(&chunk[..n]);
    Some(n)
}

/// Whether the proxy closed the connection (reading gets its end within a few seconds).
pub async fn closed(conn: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest)).await,
        Ok(Ok(_))
    ) && rest.is_empty()
}
