//! The fields that frame a message and keep its connection open (RFC 9110 §8.6, RFC 9112
//! §9.3), read the same way for the requests the proxy serves and the answers it reads.

use http::{HeaderMap, Version, header};

/// The message's `Content-Length`: every line and list element must be the same number,
/// in decimal digits only.
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, &'static str> {
    let mut found = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for part in value.as_bytes().split(|b| *b == b',') {
            let n = std::str::from_utf8(part.trim_ascii())
                .ok()
                .filter(|s| !s.is_empty() && s.len() <= 19 && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or("invalid Content-Length")?;
            if found.is_some_and(|seen| seen != n) {
                return Err("differing Content-Length values");
            }
            found = Some(n);
        }
    }
    Ok(found)
}

/// The `Connection` field names `token` (case-insensitive), on any of its lines.
pub fn connection_says(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Whether the sender lets the connection carry another message after this one.
pub fn keeps_alive(headers: &HeaderMap, version: Version) -> bool {
    !connection_says(headers, "close")
        && (version == Version::HTTP_11 || connection_says(headers, "keep-alive"))
}
