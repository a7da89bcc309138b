//! serde's messages in an operator's words: "expected u16" and "invalid type: map" are
//! how a deserializer talks, not how someone fixing `release_on: [5xx]` at 3 a.m. reads.

/// Lists of HTTP status codes in the file, where `5xx` is the likely slip.
const STATUS_LISTS: [&str; 4] = ["release_on", "ambiguous_statuses", "found", "not_found"];

/// Rewrites one serde message about the value at `path` (`routes[0].release_on[0]`).
pub fn humanize(path: &str, message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown field ") {
        return unknown_field(rest);
    }
    let (found, expected) = if let Some(rest) = message.strip_prefix("invalid type: ") {
        match rest.split_once(", expected ") {
            Some((found, expected)) => (found, expected),
            None => return message.to_owned(),
        }
    } else if let Some(rest) = message.strip_prefix("invalid value: ") {
        match rest.split_once(", expected ") {
            Some((found, expected)) => (found, expected),
            None => return message.to_owned(),
        }
    } else {
        return message.to_owned();
    };
    let in_status_list = STATUS_LISTS
        .iter()
        .any(|list| path.contains(&format!("{list}[")));
    let expected = if in_status_list {
        "an HTTP status code such as 503 (list each code: classes like 5xx are not accepted)"
            .to_owned()
    } else {
        expected_words(expected)
    };
    format!("expected {expected}, found {}", found_words(found))
}

/// `unknown field `feilds`, expected one of `fields`, `headers``, with the likely key.
fn unknown_field(rest: &str) -> String {
    let (name, expected) = match rest.split_once(", expected ") {
        Some((name, expected)) => (name, Some(expected)),
        None => (rest, None),
    };
    let name = name.trim_matches('`');
    let Some(expected) = expected else {
        return format!("unknown key `{name}`");
    };
    if expected == "there are no fields" {
        return format!("unknown key `{name}`: this mapping takes no keys");
    }
    let choices: Vec<&str> = expected
        .trim_start_matches("one of ")
        .split([',', ' '])
        .filter(|c| *c != "or")
        .map(|c| c.trim_matches('`'))
        .filter(|c| !c.is_empty())
        .collect();
    let known = choices
        .iter()
        .map(|c| format!("`{c}`"))
        .collect::<Vec<_>>()
        .join(", ");
    match closest(name, &choices) {
        Some(guess) => format!("unknown key `{name}`: did you mean `{guess}`?"),
        None => format!("unknown key `{name}`; known keys: {known}"),
    }
}

fn expected_words(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number (0 or more)".into(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".into(),
        "a sequence" => "a list, e.g. [a, b]".into(),
        "a boolean" => "true or false".into(),
        "a string" => "a text value".into(),
        e if e.starts_with("struct ") => "a mapping of keys (key: value)".into(),
        e => e.to_owned(),
    }
}

fn found_words(found: &str) -> String {
    if let Some(text) = found.strip_prefix("string ") {
        return format!("the text {text}");
    }
    for kind in ["integer ", "floating point "] {
        if let Some(n) = found.strip_prefix(kind) {
            return format!("the number {}", n.trim_matches('`'));
        }
    }
    if let Some(b) = found.strip_prefix("boolean ") {
        return b.trim_matches('`').to_owned();
    }
    match found {
        "map" => "a mapping".into(),
        "sequence" => "a list".into(),
        "unit value" | "null" => "nothing (an empty value)".into(),
        f => f.to_owned(),
    }
}

/// The known key a typo most likely meant: at most two edits away, or the only one that
/// starts the same way.
fn closest<'a>(name: &str, choices: &[&'a str]) -> Option<&'a str> {
    choices
        .iter()
        .map(|c| (edit_distance(name, c), *c))
        .filter(|&(d, c)| d <= 2.max(c.len() / 4))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(row[j]).min(row[j + 1])
            };
            prev = here;
        }
    }
    row[b.len()]
}

/// A YAML syntax error in the operator's words (the parser's own advice about its
/// options is not theirs to follow).
pub fn yaml_syntax(message: &str) -> String {
    message
        .replace(
            ", set DuplicateKeyPolicy in Options if acceptable",
            " (a key written twice: keep one)",
        )
        .replace("duplicate mapping key: ", "duplicate key ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_the_key_they_meant() {
        let m = humanize(
            "routes[0].fingerprint",
            "unknown field `feilds`, expected one of `fields`, `headers`",
        );
        assert!(m == "unknown key `feilds`: did you mean `fields`?", "{m}");
        let m = humanize(
            "routes[0].on_conflict",
            "unknown field `wiat`, expected `wait`",
        );
        assert!(m.contains("did you mean `wait`?"), "{m}");
        let m = humanize(
            ".",
            "unknown field `zzzzzz`, expected one of `listen`, `routes`",
        );
        assert!(!m.contains("did you mean"), "{m}");
    }

    #[test]
    fn type_errors_say_what_is_wanted() {
        let m = humanize(
            "routes[0].release_on[0]",
            "invalid type: string \"5xx\", expected u16",
        );
        assert!(
            m.contains("status code") && m.contains("\"5xx\"") && !m.contains("u16"),
            "{m}"
        );
        let m = humanize(
            "upstream.max_connections",
            "invalid type: string \"many\", expected usize",
        );
        assert_eq!(
            m,
            "expected a whole number (0 or more), found the text \"many\""
        );
        let m = humanize("routes", "invalid type: map, expected a sequence");
        assert_eq!(m, "expected a list, e.g. [a, b], found a mapping");
        let m = humanize(
            "upstream",
            "invalid type: string \"x\", expected struct FileUpstream",
        );
        assert!(m.starts_with("expected a mapping"), "{m}");
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("feilds", "fields"), 2);
        assert_eq!(edit_distance("wiat", "wait"), 2);
        assert_eq!(edit_distance("lease", "lease"), 0);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
