//! Canonical JSON after RFC 8785 (JCS): sorted keys, no insignificant whitespace, numbers and
//! strings in one normal form, so that the same request serialised by another library, with
//! another field order or with `1.0` for `1`, has the same fingerprint.
//!
//! One deliberate deviation: integers that do not fit an IEEE double exactly (beyond ±2^53)
//! are written with all their digits instead of being rounded, so two different large
//! amounts can never share a fingerprint.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

mod borrowed;

pub use borrowed::canonical_strict;

/// Parses JSON like `serde_json::from_slice`, but rejects an object that names a member
/// twice. `{"amount":100,"amount":500}` means different things to different parsers (first
/// wins, last wins); fingerprinting one reading while the upstream acts on the other could
/// replay the answer of a different operation, so such a body is refused instead.
pub fn parse_strict(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Strict.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// A `Value` seed that refuses duplicate member names.
#[derive(Clone, Copy)]
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number JSON cannot hold"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Strict)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                return Err(duplicate_member(&name));
            }
            let value = map.next_value_seed(Strict)?;
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }
}

/// The order of an object's members: JCS sorts them by the UTF-16 code units of their
/// names, not by their UTF-8 bytes (RFC 8785 §3.2.3).
fn member_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// The refusal of an object that names `name` twice.
fn duplicate_member<E: de::Error>(name: &str) -> E {
    E::custom(format!("member `{name}` appears twice in one object"))
}

/// Appends the canonical form of `value` to `out`.
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| member_order(a.0, b.0));
            out.push(b'{');
            for (i, (name, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(name, out);
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
    }
}

/// The canonical form of `value` as bytes.
pub fn to_canonical(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    out
}

fn write_number(n: &Number, out: &mut Vec<u8>) {
    if let Some(i) = n.as_i64() {
        out.extend_from_slice(i.to_string().as_bytes());
    } else if let Some(u) = n.as_u64() {
        out.extend_from_slice(u.to_string().as_bytes());
    } else if let Some(f) = n.as_f64() {
        if f == 0.0 {
            // ECMAScript prints -0 as 0.
            out.push(b'0');
        } else {
            let mut buffer = ryu_js::Buffer::new();
            out.extend_from_slice(buffer.format_finite(f).as_bytes());
        }
    }
}

/// JCS string escaping is exactly what serde_json does: `"`, `\` and control characters,
/// the short forms where they exist and lowercase `\u00xx` otherwise; everything else as is.
fn write_string(s: &str, out: &mut Vec<u8>) {
    // Serialising a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        let value: Value = serde_json::from_str(text).unwrap();
        String::from_utf8(to_canonical(&value)).unwrap()
    }

    /// Key order and whitespace do not matter.
    #[test]
    fn sorts_and_strips() {
        assert_eq!(
            canon(r#"{ "b" : 1, "a" : [ true , null ] }"#),
            r#"{"a":[true,null],"b":1}"#
        );
    }

    /// Equivalent number spellings meet in one form (RFC 8785 §3.2.2.3 examples).
    #[test]
    fn numbers_normalise() {
        assert_eq!(canon("[1.0, 1e0, 10E-1, -0, 0.0]"), "[1,1,1,0,0]");
        assert_eq!(
            canon("[1e21, 1e-7, 123.456, 4.50]"),
            "[1e+21,1e-7,123.456,4.5]"
        );
        assert_eq!(canon("100000000000000000000"), "100000000000000000000");
        assert_eq!(
            canon("[9007199254740993, 18446744073709551615]"),
            "[9007199254740993,18446744073709551615]"
        );
    }

    /// Strings keep their characters and escape only what JSON requires.
    #[test]
    fn strings_escape_minimally() {
        assert_eq!(canon(r#""\u00e9\u20ac\/\u001f\n""#), "\"é€/\\u001f\\n\"");
    }

    /// A member named twice is refused; the same name in different objects is fine.
    #[test]
    fn duplicate_members_are_refused() {
        let err = parse_strict(br#"{"amount":100,"amount":500}"#).unwrap_err();
        assert!(err.to_string().contains("`amount` appears twice"), "{err}");
        assert!(parse_strict(br#"{"a":{"x":1},"b":{"x":2}}"#).is_ok());
        assert!(
            parse_strict(br#"[{"a":1}] x"#).is_err(),
            "trailing characters"
        );
        assert_eq!(
            parse_strict(b"[1, 2.5, \"s\", null]").unwrap(),
            serde_json::json!([1, 2.5, "s", null])
        );
    }

    /// Member names sort by UTF-16 code units, not by UTF-8 bytes (RFC 8785 §3.2.3).
    #[test]
    fn utf16_order() {
        // U+FB33 sorts after U+1F600 in UTF-8 but before it in UTF-16 (surrogates are D8xx).
        assert_eq!(
            canon("{\"\u{fb33}\":1,\"\u{1f600}\":2}"),
            "{\"\u{1f600}\":2,\"\u{fb33}\":1}"
        );
    }
}
