//! The fuzz target for the request head parser and the chunked decoder: proptest with a
//! case budget from `IDEMPROXY_FUZZ_CASES` (2,000 by default; cargo-fuzz needs a nightly
//! toolchain this project does not use). Inputs are valid messages damaged at the byte
//! level, and raw bytes, each fed whole and split at every point a read could split it.
//!
//! What must hold: no panic; no loop (each decoder step consumes bytes or stops); memory
//! bounded (nothing decoded is larger than its input, the read-ahead never grows past a
//! head's limit); and the answer does not depend on where reads split the bytes — a head
//! complete in the whole is incomplete, never refused or complete, in every prefix.

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::error::HeadError;
use super::head::parse;
use crate::http1::{Decoder, Framing};

const LIMIT: usize = 2048;

fn budget() -> u32 {
    std::env::var("IDEMPROXY_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// A plausible head: a request line, fields from the ones that frame and route, an end.
fn head() -> impl Strategy<Value = Vec<u8>> {
    let line = prop::sample::select(vec![
        "POST /payments HTTP/1.1",
        "GET /orders/1?x=%20 HTTP/1.1",
        "OPTIONS * HTTP/1.1",
        "GET http://api.example/a HTTP/1.1",
        "GET /a HTTP/1.0",
        "CONNECT api.example:443 HTTP/1.1",
    ]);
    let field = prop::sample::select(vec![
        "Host: api.example",
        "host: [::1]:80",
        "Content-Length: 5",
        "content-length: 5, 5",
        "Transfer-Encoding: chunked",
        "transfer-encoding: gzip, chunked",
        "Connection: keep-alive, close",
        "Expect: 100-continue",
        "Upgrade: h2c",
        "Idempotency-Key: \"k-1\"",
        "X-Note: caf\u{e9}\tx",
    ]);
    (line, prop::collection::vec(field, 0..6)).prop_map(|(line, fields)| {
        let mut out = format!("{line}\r\n");
        for f in fields {
            out.push_str(f);
            out.push_str("\r\n");
        }
        out.push_str("\r\n");
        out.into_bytes()
    })
}

/// A chunked body with extensions and a trailer.
fn chunked_body() -> impl Strategy<Value = Vec<u8>> {
    let ext = prop::sample::select(vec!["", ";a", ";a=b", " ; a = \"q \\\" d\"", ";x;y=z"]);
    (prop::collection::vec((prop::collection::vec(any::<u8>(), 1..20), ext), 0..5)).prop_map(
        |chunks| {
            let mut out = Vec::new();
            for (data, ext) in chunks {
                out.extend_from_slice(format!("{:X}{ext}\r\n", data.len()).as_bytes());
                out.extend_from_slice(&data);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\nx-t: 1\r\n\r\n");
            out
        },
    )
}

/// `bytes` with a few bytes inserted, removed or replaced, from the ones that matter to
/// the grammar.
fn damaged(bytes: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let byte = prop::sample::select(b"\r\n \t\0\x80\xff;,:\"=\x0b/a0F".to_vec());
    let edit = (0u8..3, any::<usize>(), byte);
    (bytes, prop::collection::vec(edit, 0..4)).prop_map(|(mut bytes, edits)| {
        for (kind, at, b) in edits {
            let at = at % (bytes.len() + 1);
            match kind {
                0 => bytes.insert(at, b),
                1 if at < bytes.len() => {
                    bytes.remove(at);
                }
                _ if at < bytes.len() => bytes[at] = b,
                _ => {}
            }
        }
        bytes
    })
}

/// Decodes `input` fed in pieces of `step` bytes: the data, and how the decoder ended
/// (`Ok` with its state, or the error), with a bound on steps that catches a loop.
fn decode(input: &[u8], step: usize) -> (Vec<u8>, Result<Decoder, String>) {
    let mut decoder = Decoder::new(Framing::Chunked);
    let mut buf = Vec::new();
    let mut out = Vec::new();
    for piece in input.chunks(step.max(1)) {
        buf.extend_from_slice(piece);
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps <= 2 * input.len() + 4, "the decoder loops");
            let before = buf.len();
            match decoder.step(&mut buf) {
                Ok(Some(data)) => {
                    assert!(buf.len() < before, "data without consuming bytes");
                    out.extend_from_slice(&data);
                }
                Ok(None) => break,
                Err(e) => return (out, Err(e.to_string())),
            }
        }
        if decoder == Decoder::Done {
            break;
        }
    }
    (out, Ok(decoder))
}

/// Checks that what `parse` says of `bytes` holds at every split: a complete head is
/// incomplete in each shorter prefix; a refused one is incomplete or refused alike.
fn head_is_split_proof(bytes: &[u8]) -> Result<(), TestCaseError> {
    let whole = parse(bytes, LIMIT);
    for cut in 0..bytes.len() {
        let prefix = parse(&bytes[..cut], LIMIT);
        match (&whole, &prefix) {
            (_, Ok(None)) => {}
            (Ok(Some((_, len))), Ok(Some((_, l)))) if cut >= *len => {
                prop_assert_eq!(l, len);
            }
            (Err(e), Err(p)) => prop_assert_eq!(
                std::mem::discriminant(e),
                std::mem::discriminant(p),
                "{:?} then {:?} at {}",
                p,
                e,
                cut
            ),
            (w, p) => {
                return Err(TestCaseError::fail(format!(
                    "prefix of {cut} bytes: {p:?}, whole: {w:?}"
                )));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: budget(), failure_persistence: None, ..ProptestConfig::default() })]

    /// Damaged heads: refused or read, the same at every split.
    #[test]
    fn damaged_heads(bytes in damaged(head())) {
        head_is_split_proof(&bytes)?;
    }

    /// Raw bytes after a valid request line.
    #[test]
    fn raw_fields(rest in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut bytes = b"POST /payments HTTP/1.1\r\n".to_vec();
        bytes.extend_from_slice(&rest);
        head_is_split_proof(&bytes)?;
    }

    /// Heads past the limit are refused as too large, never read and never a panic.
    #[test]
    fn oversized_heads(n in 0usize..3 * LIMIT) {
        let bytes = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(n));
        match parse(bytes.as_bytes(), LIMIT) {
            Ok(Some((_, len))) => prop_assert!(len <= LIMIT),
            Err(HeadError::UriTooLong { .. }) => prop_assert!(n + 16 > LIMIT),
            Err(HeadError::TooLarge { .. }) => prop_assert!(n + 16 <= LIMIT && bytes.len() > LIMIT),
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        }
    }

    /// Damaged chunked bodies decode the same however reads split them, yield no more
    /// than they were given, and never loop.
    #[test]
    fn damaged_chunked_bodies(bytes in damaged(chunked_body()), step in 1usize..40) {
        let (data, end) = decode(&bytes, bytes.len().max(1));
        let (split_data, split_end) = decode(&bytes, step);
        prop_assert!(data.len() <= bytes.len());
        prop_assert_eq!(&data[..split_data.len().min(data.len())], &split_data[..split_data.len().min(data.len())]);
        prop_assert_eq!(end.is_ok(), split_end.is_ok());
        if let (Ok(a), Ok(b)) = (end, split_end) {
            prop_assert_eq!(a, b);
            prop_assert_eq!(data, split_data);
        }
    }

    /// Raw bytes as a chunked body.
    #[test]
    fn raw_chunked_bodies(bytes in prop::collection::vec(any::<u8>(), 0..300), step in 1usize..40) {
        let (data, _) = decode(&bytes, step);
        prop_assert!(data.len() <= bytes.len());
    }
}
