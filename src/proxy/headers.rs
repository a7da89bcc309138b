//! Header values given an allocation of their own while a request or an answer waits.

use bytes::{BufMut, BytesMut};
use http::{HeaderMap, HeaderValue};

/// Gives a message's header values an allocation of their own, one for all of them.
///
/// hyper hands out header values as slices of the connection's 8 KiB read buffer, so
/// whatever holds a head holds that whole buffer, and the connection reads its next
/// message into a new one. A keyed request waits for the store with its head, and its
/// answer waits for the completion: as copies, each head costs its own few hundred bytes
/// instead of a read buffer (at 1,000 waiting requests, the difference is 16 MiB).
pub fn detach_headers(headers: &mut HeaderMap) {
    let total = headers.values().map(HeaderValue::len).sum();
    let mut copy = BytesMut::with_capacity(total);
    for value in headers.values() {
        copy.put_slice(value.as_bytes());
    }
    let copy = copy.freeze();
    let mut at = 0;
    for value in headers.values_mut() {
        let len = value.len();
        if let Ok(mut detached) = HeaderValue::from_maybe_shared(copy.slice(at..at + len)) {
            detached.set_sensitive(value.is_sensitive());
            *value = detached;
        }
        at += len;
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::header;

    use super::*;

    /// X-Forwarded-For is appended to, not replaced.
    /// Detached values are equal to the originals, keep their order and sensitivity, and
    /// no longer share the buffer the head was read into.
    #[test]
    fn detached_headers_own_their_bytes() {
        let read_buffer = Bytes::from_static(b"aaa, bbbccc");
        let mut h = HeaderMap::new();
        h.append(
            "x-a",
            HeaderValue::from_maybe_shared(read_buffer.slice(0..3)).unwrap(),
        );
        h.append(
            "x-a",
            HeaderValue::from_maybe_shared(read_buffer.slice(5..8)).unwrap(),
        );
        let mut secret = HeaderValue::from_maybe_shared(read_buffer.slice(8..11)).unwrap();
        secret.set_sensitive(true);
        h.insert(header::AUTHORIZATION, secret);
        let before = h.clone();
        detach_headers(&mut h);
        assert_eq!(h, before);
        assert!(h[header::AUTHORIZATION].is_sensitive());
        let buffer = read_buffer.as_ptr_range();
        for value in h.values() {
            assert!(!buffer.contains(&value.as_bytes().as_ptr()));
        }
    }
}
