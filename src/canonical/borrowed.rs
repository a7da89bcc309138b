//! The whole-body canonical form without building a `serde_json::Value`: every keyed
//! request with a JSON body is canonicalised for its fingerprint, and a `Value` costs an
//! allocation per string, per member name and per map node (about a fifth of a keyed
//! request's allocations). Here strings stay borrowed from the body unless they hold
//! escapes, and an object is one `Vec` of members, sorted when written.
//!
//! Same output and same refusals as [`super::parse_strict`] then
//! [`super::write_canonical`] (a property test holds the two together).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Number;

use super::{duplicate_member, member_order, write_number, write_string};

/// Objects up to this many members are checked for a repeated name by scanning them; a
/// larger one keeps a set of its names, so that a large body cannot cost quadratic time.
const SCAN_MEMBERS: usize = 16;

/// Parses `bytes` as JSON, refusing an object that names a member twice, and returns its
/// canonical form (RFC 8785, with the deviation for large integers described in
/// [`super`]).
pub fn canonical_strict(bytes: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let mut node = Tree.deserialize(&mut de)?;
    de.end()?;
    let mut out = Vec::with_capacity(bytes.len());
    write_node(&mut node, &mut out);
    Ok(out)
}

/// A JSON value whose strings borrow from the input where they can.
enum Node<'de> {
    Null,
    Bool(bool),
    Number(Number),
    String(Cow<'de, str>),
    Array(Vec<Node<'de>>),
    Object(Vec<(Cow<'de, str>, Node<'de>)>),
}

/// The seed of a [`Node`].
#[derive(Clone, Copy)]
struct Tree;

impl<'de> DeserializeSeed<'de> for Tree {
    type Value = Node<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node<'de>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Tree {
    type Value = Node<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Node<'de>, E> {
        Ok(Node::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Node<'de>, E> {
        Ok(Node::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Node<'de>, E> {
        Ok(Node::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node<'de>, E> {
        Number::from_f64(v)
            .map(Node::Number)
            .ok_or_else(|| E::custom("a number JSON cannot hold"))
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Node<'de>, E> {
        Ok(Node::String(Cow::Borrowed(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Node<'de>, E> {
        Ok(Node::String(Cow::Owned(v.to_owned())))
    }

    fn visit_string<E>(self, v: String) -> Result<Node<'de>, E> {
        Ok(Node::String(Cow::Owned(v)))
    }

    fn visit_unit<E>(self) -> Result<Node<'de>, E> {
        Ok(Node::Null)
    }

    fn visit_none<E>(self) -> Result<Node<'de>, E> {
        Ok(Node::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node<'de>, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Tree)? {
            items.push(item);
        }
        Ok(Node::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node<'de>, A::Error> {
        let mut members: Vec<(Cow<'de, str>, Node<'de>)> = Vec::new();
        // Past SCAN_MEMBERS: the names so far.
        let mut names: Option<BTreeSet<Cow<'de, str>>> = None;
        while let Some(name) = map.next_key_seed(Name)? {
            let repeated = match &mut names {
                Some(names) => !names.insert(name.clone()),
                None => members.iter().any(|(seen, _)| *seen == name),
            };
            if repeated {
                return Err(duplicate_member(&name));
            }
            if names.is_none() && members.len() >= SCAN_MEMBERS {
                let mut set: BTreeSet<_> = members.iter().map(|(n, _)| n.clone()).collect();
                set.insert(name.clone());
                names = Some(set);
            }
            let value = map.next_value_seed(Tree)?;
            members.push((name, value));
        }
        Ok(Node::Object(members))
    }
}

/// The seed of a member name, borrowed where the input allows.
struct Name;

impl<'de> DeserializeSeed<'de> for Name {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Cow<'de, str>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Name {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v))
    }
}

/// Appends the canonical form of `node`, sorting its objects' members in place.
fn write_node(node: &mut Node<'_>, out: &mut Vec<u8>) {
    match node {
        Node::Null => out.extend_from_slice(b"null"),
        Node::Bool(true) => out.extend_from_slice(b"true"),
        Node::Bool(false) => out.extend_from_slice(b"false"),
        Node::Number(n) => write_number(n, out),
        Node::String(s) => write_string(s, out),
        Node::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter_mut().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_node(item, out);
            }
            out.push(b']');
        }
        Node::Object(members) => {
            // No two names are equal, so an unstable sort is as good.
            members.sort_unstable_by(|a, b| member_order(&a.0, &b.0));
            out.push(b'{');
            for (i, (name, item)) in members.iter_mut().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(name, out);
                out.push(b':');
                write_node(item, out);
            }
            out.push(b'}');
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::canonical_strict;
    use crate::canonical::{parse_strict, to_canonical};

    /// What the `Value` path makes of `text`: its canonical form or its error's message.
    fn through_value(text: &str) -> Result<Vec<u8>, String> {
        parse_strict(text.as_bytes())
            .map(|v| to_canonical(&v))
            .map_err(|e| e.to_string())
    }

    fn borrowed(text: &str) -> Result<Vec<u8>, String> {
        canonical_strict(text.as_bytes()).map_err(|e| e.to_string())
    }

    /// JSON texts (and near-JSON ones) rich in what canonicalisation must get right:
    /// escapes, repeated and escaped-equal member names, number spellings, nesting.
    fn json_text() -> impl Strategy<Value = String> {
        let number = prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            "-?[0-9]{1,25}",
            "-?[0-9]{1,4}\\.[0-9]{1,6}([eE][+-]?[0-9]{1,3})?",
        ];
        let string = "\"([ab/é😀]|\\\\u00[46]1|\\\\n|\\\\\"|\\\\/|\\\\ud83d\\\\ude00){0,4}\"";
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            number,
            string,
        ];
        leaf.prop_recursive(4, 64, 24, |inner| {
            // U+FB33 and U+1F600 sort one way in UTF-8 and the other in UTF-16.
            let name = "\"([ab]|\\\\u0061|\u{fb33}|😀){0,2}\"";
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec((name, inner), 0..24).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(n, v)| format!("{n} : {v}"))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

        /// Byte for byte the same canonical form, and the same refusals, as the `Value` path.
        #[test]
        fn same_as_the_value_path(text in json_text()) {
            prop_assert_eq!(borrowed(&text), through_value(&text));
        }
    }

    /// Objects past the scanned size find a repeated name through their set of names, at
    /// the same place; escaped spellings of one name are the same name.
    #[test]
    fn repeated_names_in_large_objects() {
        let mut members: Vec<String> = (0..40).map(|i| format!("\"m{i}\":{i}")).collect();
        members.push("\"m\\u0033\":0".to_owned());
        let text = format!("{{{}}}", members.join(","));
        let err = borrowed(&text).unwrap_err();
        assert!(err.contains("`m3` appears twice"), "{err}");
        assert_eq!(Err(err), through_value(&text));
        let text = format!("{{{}}}", members[..40].join(","));
        assert_eq!(borrowed(&text), through_value(&text));
    }
}
