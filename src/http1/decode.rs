//! Reading a message body off the wire (RFC 9112 §6–7): by its length, in chunks, or
//! until the connection closes — the same decoder for requests the proxy serves and
//! answers it reads from the upstream.

use bytes::Bytes;

use super::Framing;
use super::grammar;

/// What a chunk-size line (with its extensions) or a trailer field may take at most.
const MAX_LINE: usize = 8 * 1024;
/// All trailer fields together at most.
const MAX_TRAILERS: usize = 64 * 1024;

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the connection closed before the body was complete")]
    Closed,
    #[error("malformed chunked body: {0}")]
    Chunked(&'static str),
    #[error("reading the body failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Where the decoder stands in a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoder {
    /// Bytes of a `Content-Length` body still to come.
    Length(u64),
    /// Everything until the connection closes (an answer with neither length nor chunks).
    UntilClose,
    /// Before a chunk-size line.
    ChunkSize,
    /// Bytes of the current chunk still to come.
    ChunkData(u64),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    /// Trailer fields, so many bytes of them seen.
    Trailers(usize),
    /// The body has ended.
    Done,
}

impl Decoder {
    pub fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::ChunkSize,
            Framing::UntilClose => Decoder::UntilClose,
        }
    }

    /// The stream ended (the peer closed): the end of an `UntilClose` body, an error for
    /// any other that has not ended.
    pub fn at_eof(&mut self) -> Result<(), BodyError> {
        match self {
            Decoder::Done => Ok(()),
            Decoder::UntilClose => {
                *self = Decoder::Done;
                Ok(())
            }
            _ => Err(BodyError::Closed),
        }
    }

    /// Decodes from the front of `buf`: the next data (drained from `buf`), `Ok(None)`
    /// when more bytes are needed or the body has ended (see `self`).
    pub fn step(&mut self, buf: &mut Vec<u8>) -> Result<Option<Bytes>, BodyError> {
        loop {
            match *self {
                Decoder::Done => return Ok(None),
                Decoder::UntilClose => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    return Ok(Some(Bytes::from(std::mem::take(buf))));
                }
                Decoder::Length(0) => *self = Decoder::Done,
                Decoder::Length(n) | Decoder::ChunkData(n) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let take = usize::try_from(n).unwrap_or(usize::MAX).min(buf.len());
                    let data = Bytes::copy_from_slice(&buf[..take]);
                    buf.drain(..take);
                    let left = n - take as u64;
                    *self = match *self {
                        Decoder::Length(_) => Decoder::Length(left),
                        _ if left == 0 => Decoder::ChunkEnd,
                        _ => Decoder::ChunkData(left),
                    };
                    return Ok(Some(data));
                }
                Decoder::ChunkSize => {
                    let Some(line) = take_line(buf, MAX_LINE)? else {
                        return Ok(None);
                    };
                    *self = match chunk_size(&line)? {
                        0 => Decoder::Trailers(0),
                        n => Decoder::ChunkData(n),
                    };
                }
                Decoder::ChunkEnd => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(BodyError::Chunked("chunk data longer than its size"));
                    }
                    buf.drain(..2);
                    *self = Decoder::ChunkSize;
                }
                Decoder::Trailers(seen) => {
                    let Some(line) = take_line(buf, MAX_LINE)? else {
                        return Ok(None);
                    };
                    let seen = seen + line.len() + 2;
                    if seen > MAX_TRAILERS {
                        return Err(BodyError::Chunked("trailer fields too large"));
                    }
                    // Trailer fields are read by the field grammar but not forwarded: the
                    // proxy re-frames the body.
                    if !line.is_empty() {
                        grammar::field_line(&line)
                            .map_err(|_| BodyError::Chunked("a malformed trailer field"))?;
                    }
                    *self = if line.is_empty() {
                        Decoder::Done
                    } else {
                        Decoder::Trailers(seen)
                    };
                }
            }
        }
    }

    /// The body's size hint: exact when the bytes still to come are known.
    pub fn size_hint(&self) -> http_body::SizeHint {
        match self.remaining() {
            Some(n) => http_body::SizeHint::with_exact(n),
            None => http_body::SizeHint::default(),
        }
    }

    /// Bytes of the body known to be still to come.
    fn remaining(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Done => Some(0),
            _ => None,
        }
    }
}

/// Takes a CRLF-terminated line off the front of `buf`, without its CRLF.
fn take_line(buf: &mut Vec<u8>, max: usize) -> Result<Option<Vec<u8>>, BodyError> {
    let Some(lf) = buf.iter().take(max + 2).position(|b| *b == b'\n') else {
        return if buf.len() > max + 1 {
            Err(BodyError::Chunked("line too long"))
        } else {
            Ok(None)
        };
    };
    if lf == 0 || buf[lf - 1] != b'\r' {
        return Err(BodyError::Chunked("line not ended by CRLF"));
    }
    if buf[..lf - 1].contains(&b'\r') {
        return Err(BodyError::Chunked("a bare CR in a line"));
    }
    let line = buf[..lf - 1].to_vec();
    buf.drain(..=lf);
    Ok(Some(line))
}

/// A chunk-size line, read by the grammar ([`grammar::chunk_size_line`]).
fn chunk_size(line: &[u8]) -> Result<u64, BodyError> {
    grammar::chunk_size_line(line).map_err(BodyError::Chunked)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Decodes `input` fed in pieces of `step` bytes; the data and how the decoder ended.
    fn decode(
        framing: Framing,
        input: &[u8],
        step: usize,
    ) -> (Vec<u8>, Result<Decoder, String>, Vec<u8>) {
        let mut decoder = Decoder::new(framing);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        for piece in input.chunks(step.max(1)) {
            buf.extend_from_slice(piece);
            loop {
                match decoder.step(&mut buf) {
                    Ok(Some(data)) => out.extend_from_slice(&data),
                    Ok(None) => break,
                    Err(e) => return (out, Err(e.to_string()), buf),
                }
            }
            if decoder == Decoder::Done {
                break;
            }
        }
        (out, Ok(decoder), buf)
    }

    /// A chunked body decodes to its data however the bytes are split, with extensions
    /// and trailers skipped and the next request's bytes left over.
    #[test]
    fn chunked_bodies_decode_whatever_the_split() {
        let input = b"5;ext=1\r\nhello\r\n1A ;x=\"y\"\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-t: 1\r\n\r\nGET /next";
        for step in 1..input.len() {
            let (data, end, left) = decode(Framing::Chunked, input, step);
            assert_eq!(end.unwrap(), Decoder::Done, "split {step}");
            assert_eq!(data, b"helloabcdefghijklmnopqrstuvwxyz");
            assert!(b"GET /next".starts_with(&left), "split {step}: {left:?}");
        }
    }

    /// A length-delimited body stops at its length.
    #[test]
    fn length_bodies_stop_at_their_length() {
        let (data, end, left) = decode(Framing::Length(5), b"helloGET", 64);
        assert_eq!(
            (data.as_slice(), end.unwrap()),
            (&b"hello"[..], Decoder::Done)
        );
        assert_eq!(left, b"GET");
    }

    /// Malformed chunked bodies are errors, never a panic or a wrong body.
    #[test]
    fn malformed_chunks_are_refused() {
        for input in [
            &b"zz\r\n"[..],
            b"5\r\nhelloX\r\n",
            b"5\nhello\r\n",
            b"-5\r\n",
            b"5 x\r\nhello\r\n",
            b"ffffffffffffffffff\r\n",
            b"\r\n",
            b"a \r\n0123456789\r\n0\r\n\r\n",
            b"5\r\r;ABCD\r\nhello\r\n0\r\n\r\n",
            b"5;\r\nhello\r\n0\r\n\r\n",
            b"5;a b\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\nx : y\r\n\r\n",
            b"5\r\nhello\r\n0\r\n folded\r\n\r\n",
            b"5\r\nhello\r\n0\r\nx: a\rb\r\n\r\n",
        ] {
            let (_, end, _) = decode(Framing::Chunked, input, 64);
            assert!(end.is_err(), "{input:?}");
        }
        let long = vec![b'1'; MAX_LINE + 10];
        assert!(decode(Framing::Chunked, &long, 64).1.is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 500, failure_persistence: None, ..Default::default() })]

        /// A body chunked any way and read in pieces of any size decodes to itself.
        #[test]
        fn chunked_round_trip(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            sizes in proptest::collection::vec(1usize..40, 1..20),
            step in 1usize..50,
        ) {
            let mut wire = Vec::new();
            let mut rest = &body[..];
            let mut sizes = sizes.iter().cycle();
            while !rest.is_empty() {
                let n = (*sizes.next().unwrap_or(&1)).min(rest.len());
                wire.extend_from_slice(format!("{n:X}\r\n").as_bytes());
                wire.extend_from_slice(&rest[..n]);
                wire.extend_from_slice(b"\r\n");
                rest = &rest[n..];
            }
            wire.extend_from_slice(b"0\r\n\r\n");
            let (data, end, left) = decode(Framing::Chunked, &wire, step);
            proptest::prop_assert_eq!(end.ok(), Some(Decoder::Done));
            proptest::prop_assert_eq!(data, body);
            proptest::prop_assert!(left.is_empty());
        }

        /// No bytes make the chunked decoder panic or yield more than it was given.
        #[test]
        fn any_bytes_decode_or_fail(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            step in 1usize..50,
        ) {
            let (data, _, _) = decode(Framing::Chunked, &bytes, step);
            proptest::prop_assert!(data.len() <= bytes.len());
        }
    }
}
