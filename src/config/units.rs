//! Human-readable durations (`250ms`, `30s`, `1h30m`) and sizes (`1MiB`, `512KB`).
//!
//! Operators read and write these values at 3 a.m.; `lease: 30000` invites a unit mistake,
//! `lease: 30s` does not. Parsing is pure so that it can be unit-tested without files.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer};

/// A duration written with units in the YAML file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

/// A byte size written with units in the YAML file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanSize(pub u64);

/// Parses `250ms`, `30s`, `5m`, `24h`, `7d` and sums like `1h30m`; spaces between a
/// number and its unit or between parts (`10 s`, `1h 30m`) are allowed, as in sizes.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration; write it like 30s, 250ms or 24h".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!(
                "`{text}` is not a duration; write it like 30s, 250ms or 24h"
            ));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("`{text}`: number too large"))?;
        rest = rest[digits..].trim_start();
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c.is_whitespace())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = rest[unit_len..].trim_start();
        let millis_per_unit: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => {
                return Err(format!(
                    "`{text}` has no unit; write it like 30s, 250ms or 24h"
                ));
            }
            other => {
                return Err(format!(
                    "`{text}`: unknown unit `{other}` (use ms, s, m, h or d)"
                ));
            }
        };
        let millis = number
            .checked_mul(millis_per_unit)
            .ok_or_else(|| format!("`{text}`: duration too large"))?;
        total = total
            .checked_add(Duration::from_millis(millis))
            .ok_or_else(|| format!("`{text}`: duration too large"))?;
    }
    Ok(total)
}

/// Parses `1024`, `64KiB`, `1MiB`, `1GiB`, `500KB`, `1MB` (binary and decimal units).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if digits == 0 {
        return Err(format!(
            "`{text}` is not a size; write it like 1MiB or 512KiB"
        ));
    }
    let number: u64 = text[..digits]
        .parse()
        .map_err(|_| format!("`{text}`: number too large"))?;
    let multiplier: u64 = match text[digits..].trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use B, KiB, MiB, GiB, KB, MB or GB)"
            ));
        }
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("`{text}`: size too large"))
}

/// Formats a duration the way the parser reads it, for `check-config` output.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    for (unit, per) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms.is_multiple_of(per) {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

/// Formats a size the way the parser reads it, for `check-config` output.
pub fn format_size(bytes: u64) -> String {
    for (unit, per) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= per && bytes.is_multiple_of(per) {
            return format!("{}{unit}", bytes / per);
        }
    }
    format!("{bytes}B")
}

struct Expecting(&'static str);

impl fmt::Display for Expecting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = de_text(deserializer, "a duration like 30s, 250ms or 24h")?;
        parse_duration(&text)
            .map(HumanDuration)
            .map_err(de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for HumanSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = de_text(deserializer, "a size like 1MiB or 512KiB")?;
        parse_size(&text).map(HumanSize).map_err(de::Error::custom)
    }
}

/// Accepts a string, or a bare number (so that `max_body: 1024` means bytes and
/// `lease: 30` gets a message about the missing unit instead of a type error).
fn de_text<'de, D: Deserializer<'de>>(
    deserializer: D,
    what: &'static str,
) -> Result<String, D::Error> {
    match serde_json::Value::deserialize(deserializer)? {
        serde_json::Value::String(s) => Ok(s),
        serde_json::Value::Number(n) => Ok(n.to_string()),
        other => Err(de::Error::invalid_type(
            unexpected(&other),
            &Expecting(what).to_string().as_str(),
        )),
    }
}

fn unexpected(value: &serde_json::Value) -> de::Unexpected<'_> {
    match value {
        serde_json::Value::Null => de::Unexpected::Unit,
        serde_json::Value::Bool(b) => de::Unexpected::Bool(*b),
        serde_json::Value::Array(_) => de::Unexpected::Seq,
        serde_json::Value::Object(_) => de::Unexpected::Map,
        serde_json::Value::String(s) => de::Unexpected::Str(s),
        serde_json::Value::Number(_) => de::Unexpected::Other("number"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Durations take spaces where sizes do; a number split by a space is still refused.
    #[test]
    fn durations_take_spaces() {
        assert_eq!(parse_duration("10 s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration(" 2 d "), Ok(Duration::from_secs(172_800)));
        assert!(parse_duration("1 0s").unwrap_err().contains("no unit"));
        assert!(
            parse_duration("10 sec")
                .unwrap_err()
                .contains("unknown unit `sec`")
        );
        assert_eq!(parse_size("10 MB"), Ok(10_000_000));
    }

    /// Every unit docs/configuration.md documents parses to the right amount.
    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
    }

    /// A number without a unit, a unit without a number and nonsense are errors, not zero.
    #[test]
    fn bad_durations_are_errors() {
        for bad in [
            "",
            "30",
            "s",
            "30 sec",
            "1.5s",
            "-1s",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    /// Binary and decimal size units are distinguished.
    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1MB"), Ok(1_000_000));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("1 furlong").is_err());
        assert!(parse_size("99999999999GiB").is_err());
    }

    /// Formatting round-trips through parsing.
    #[test]
    fn formats_round_trip() {
        for d in ["250ms", "30s", "5m", "36h", "2d"] {
            assert_eq!(format_duration(parse_duration(d).unwrap()), d);
        }
        for s in ["1MiB", "512KiB", "1000B"] {
            assert_eq!(format_size(parse_size(s).unwrap()), s);
        }
    }
}
