//! The derived key written into the request body, for providers that read their
//! idempotency key there (`upstream_key: { body: /idempotency_key }`).
//!
//! Only the member's value changes: the rest of the body is kept byte for byte (member
//! order, whitespace, number spellings), so that what the provider receives is what the
//! client sent but for the key. A missing member is added to its object.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::value::RawValue;

/// `body` with the member at `pointer` set to the string `value`: in a JSON body the
/// member of the object the pointer's parent names, in a form body the field its one
/// segment names. An error says why the body cannot carry the key there.
pub fn set_key(
    content_type: Option<&[u8]>,
    body: &[u8],
    pointer: &str,
    value: &str,
) -> Result<Bytes, String> {
    if crate::fingerprint::is_json(content_type) {
        let text =
            std::str::from_utf8(body).map_err(|_| "the body is not UTF-8 JSON".to_owned())?;
        return set_json(text, pointer, value).map(Bytes::from);
    }
    if crate::fingerprint::is_form(content_type) {
        return set_form(body, pointer, value).map(Bytes::from);
    }
    Err("the body must be JSON or a form so that the key can be written into it".into())
}

fn segments(pointer: &str) -> Result<Vec<String>, String> {
    let rest = pointer
        .strip_prefix('/')
        .ok_or_else(|| format!("`{pointer}` is not a member's JSON Pointer"))?;
    Ok(rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn set_json(text: &str, pointer: &str, value: &str) -> Result<String, String> {
    let path = segments(pointer)?;
    let Some((name, parents)) = path.split_last() else {
        return Err("the pointer names no member".into());
    };
    let quoted = serde_json::to_string(value).map_err(|e| e.to_string())?;
    // The object the member belongs to, as a slice of `text`.
    let mut object: &str = text.trim();
    for parent in parents {
        let members = members(object)?;
        object = members
            .get(parent.as_str())
            .map(|raw| raw.get())
            .ok_or_else(|| format!("the body has no object at `/{parent}` to hold the key"))?;
    }
    let members = members(object)?;
    let (start, end) = match members.get(name.as_str()) {
        Some(raw) => {
            let start = offset(text, raw.get());
            (start, start + raw.get().len())
        }
        None => {
            // Before the object's closing brace.
            let close = offset(text, object) + object.len() - 1;
            let sep = if members.is_empty() { "" } else { "," };
            let key = serde_json::to_string(name).map_err(|e| e.to_string())?;
            let mut out = String::with_capacity(text.len() + key.len() + quoted.len() + 2);
            out.push_str(&text[..close]);
            out.push_str(sep);
            out.push_str(&key);
            out.push(':');
            out.push_str(&quoted);
            out.push_str(&text[close..]);
            return Ok(out);
        }
    };
    let mut out = String::with_capacity(text.len() + quoted.len());
    out.push_str(&text[..start]);
    out.push_str(&quoted);
    out.push_str(&text[end..]);
    Ok(out)
}

/// An object's members, each as the slice of the input it spans.
fn members(object: &str) -> Result<HashMap<String, &RawValue>, String> {
    serde_json::from_str(object)
        .map_err(|_| "the key's place in the body is not inside a JSON object".to_owned())
}

/// Where `part` (a slice of `whole`) starts in `whole`.
fn offset(whole: &str, part: &str) -> usize {
    (part.as_ptr() as usize).saturating_sub(whole.as_ptr() as usize)
}

fn set_form(body: &[u8], pointer: &str, value: &str) -> Result<Vec<u8>, String> {
    let path = segments(pointer)?;
    let [name] = path.as_slice() else {
        return Err(
            "a form body has no nested fields; point at one field, e.g. `/idempotency_key`".into(),
        );
    };
    let encoded: String = form_urlencoded::byte_serialize(value.as_bytes()).collect();
    let mut out = Vec::with_capacity(body.len() + encoded.len() + name.len() + 2);
    let mut found = false;
    for (i, pair) in body.split(|b| *b == b'&').enumerate() {
        if i > 0 {
            out.push(b'&');
        }
        let raw_name = pair.split(|b| *b == b'=').next().unwrap_or_default();
        let decoded: String = form_urlencoded::parse(raw_name)
            .map(|(k, _)| k.into_owned())
            .collect();
        if !found && decoded == *name {
            found = true;
            out.extend_from_slice(raw_name);
            out.push(b'=');
            out.extend_from_slice(encoded.as_bytes());
        } else {
            out.extend_from_slice(pair);
        }
    }
    if !found {
        if !body.is_empty() {
            out.push(b'&');
        }
        out.extend(form_urlencoded::byte_serialize(name.as_bytes()).flat_map(str::bytes));
        out.push(b'=');
        out.extend_from_slice(encoded.as_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: Option<&[u8]> = Some(b"application/json");
    const FORM: Option<&[u8]> = Some(b"application/x-www-form-urlencoded");

    fn json(body: &str, pointer: &str) -> String {
        String::from_utf8(
            set_key(JSON, body.as_bytes(), pointer, "c:k")
                .unwrap()
                .to_vec(),
        )
        .unwrap()
    }

    /// Only the member's value changes; spacing, order and number spellings stay.
    #[test]
    fn json_members_are_replaced_in_place() {
        assert_eq!(
            json(
                r#"{ "amount" : 1.50, "idempotency_key": "old" ,"z":[1e2]}"#,
                "/idempotency_key"
            ),
            r#"{ "amount" : 1.50, "idempotency_key": "c:k" ,"z":[1e2]}"#
        );
        assert_eq!(
            json(r#"{"a":{"k":null},"b":2}"#, "/a/k"),
            r#"{"a":{"k":"c:k"},"b":2}"#
        );
    }

    /// A missing member is added to its object, empty or not.
    #[test]
    fn json_members_are_added() {
        assert_eq!(
            json(r#"{"amount":1}"#, "/key"),
            r#"{"amount":1,"key":"c:k"}"#
        );
        assert_eq!(
            json(" {} \n", "/key"),
            r#" {"key":"c:k"} "#.to_owned() + "\n"
        );
        assert_eq!(json(r#"{"a":{}}"#, "/a/k"), r#"{"a":{"k":"c:k"}}"#);
    }

    /// Bodies that cannot hold the key there are refused with the reason.
    #[test]
    fn impossible_places_are_refused() {
        for (ct, body, pointer) in [
            (JSON, "[1,2]", "/k"),
            (JSON, r#"{"a":1}"#, "/a/k"),
            (JSON, r#"{"a":1}"#, "/b/k"),
            (JSON, "{", "/k"),
            (Some(&b"text/plain"[..]), "x", "/k"),
            (FORM, "a=1", "/a/b"),
        ] {
            assert!(
                set_key(ct, body.as_bytes(), pointer, "v").is_err(),
                "{body} {pointer}"
            );
        }
    }

    /// Form fields are replaced in place or appended, the value URL-encoded.
    #[test]
    fn form_fields() {
        let set = |body: &str| {
            String::from_utf8(
                set_key(FORM, body.as_bytes(), "/idempotency_key", "c:k 1")
                    .unwrap()
                    .to_vec(),
            )
            .unwrap()
        };
        assert_eq!(
            set("amount=5&idempotency_key=old&x=%20"),
            "amount=5&idempotency_key=c%3Ak+1&x=%20"
        );
        assert_eq!(set("amount=5"), "amount=5&idempotency_key=c%3Ak+1");
        assert_eq!(set(""), "idempotency_key=c%3Ak+1");
    }
}
