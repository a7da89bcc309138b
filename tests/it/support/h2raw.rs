//! HTTP/2 written by hand (RFC 9113 frames, HPACK literals without indexing or Huffman
//! coding, with prior knowledge on a plain socket): for what client libraries will not
//! send — malformed requests, streams reset as soon as sent, peers that never read.

/// The client connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

/// An HPACK literal field without indexing, new name, no Huffman (RFC 7541 §6.2.2).
pub fn literal(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0x00);
    for s in [name, value] {
        assert!(s.len() < 127);
        out.push(s.len() as u8);
        out.extend_from_slice(s.as_bytes());
    }
}

/// One frame.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A header block of `fields`, in order.
pub fn block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (n, v) in fields {
        literal(&mut out, n, v);
    }
    out
}

/// The first whole frame in `buf`, taken out of it: (type, flags, stream, payload).
pub fn take_frame(buf: &mut Vec<u8>) -> Option<(u8, u8, u32, Vec<u8>)> {
    if buf.len() < 9 {
        return None;
    }
    let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
    if buf.len() < 9 + len {
        return None;
    }
    let (kind, flags) = (buf[3], buf[4]);
    let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
    let payload = buf[9..9 + len].to_vec();
    buf.drain(..9 + len);
    Some((kind, flags, stream, payload))
}
