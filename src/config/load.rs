//! Reading the YAML file: text → YAML → a JSON value → [`FileConfig`], so that
//! `serde_path_to_error` can name the exact key that is wrong.

use std::path::Path;

use serde_json::Value;
use serde_path_to_error::Segment;

use super::build::{Overrides, build, build_store_only};
use super::file::FileConfig;
use super::model::{Config, StoreConfig};
use super::wording;

/// Why a configuration could not be loaded. Each message names the key it is about.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Syntax(String),
    #[error("invalid configuration:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

/// At most this many structural problems are collected from one file.
const MAX_STRUCTURAL: usize = 64;

/// The file layer, with what was wrong in its shape: each offending value is reported and
/// taken out, and the rest is read again, so one run names every typo, not the first.
struct Parsed {
    file: FileConfig,
    problems: Vec<String>,
    /// Paths of the values taken out, so that checks of the rest do not report them again
    /// (a mistyped `upstream` is not also "missing `upstream.url`").
    removed: Vec<String>,
}

fn parse(text: &str) -> Result<Parsed, ConfigError> {
    let empty = || Parsed {
        file: FileConfig::default(),
        problems: Vec::new(),
        removed: Vec::new(),
    };
    if text.trim().is_empty() {
        return Ok(empty());
    }
    let mut value: Value = serde_saphyr::from_str(text).map_err(|e| {
        ConfigError::Syntax(format!(
            "YAML syntax: {}",
            wording::yaml_syntax(&e.to_string())
        ))
    })?;
    if value.is_null() {
        return Ok(empty());
    }
    let mut parsed = empty();
    for _ in 0..MAX_STRUCTURAL {
        let e = match serde_path_to_error::deserialize::<_, FileConfig>(&value) {
            Ok(file) => {
                parsed.file = file;
                return Ok(parsed);
            }
            Err(e) => e,
        };
        let path = e.path().to_string();
        let message = e.inner().to_string();
        let human = wording::humanize(&path, &message);
        // A mapping left without a required key because a misspelt one was taken out
        // (`{ wiat: 5s }`) was reported already, as the misspelling.
        let echo = message.starts_with("missing field ")
            && parsed.removed.iter().any(|r| {
                r.strip_prefix(path.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
            });
        if !echo {
            parsed.problems.push(if path == "." {
                human
            } else {
                format!("{path}: {human}")
            });
        }
        let unknown = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next());
        let segments: Vec<Segment> = e.path().iter().cloned().collect();
        match take_out(&mut value, segments, unknown) {
            Some(removed) => parsed.removed.push(removed),
            None => break,
        }
    }
    // The shape is wrong where it cannot be taken apart (the file is not a mapping).
    Err(ConfigError::Invalid(parsed.problems))
}

/// Removes the offending value: an unknown key, or the value at the error's path — a
/// whole list when one of its elements is wrong, so that later elements keep the index
/// the operator sees in the file. Returns the removed path, `None` when nothing can be.
fn take_out(
    value: &mut Value,
    mut segments: Vec<Segment>,
    unknown: Option<&str>,
) -> Option<String> {
    // An unknown key's error names either the mapping or (inside a hand-written
    // deserializer) the key itself.
    if let Some(name) = unknown
        && !matches!(segments.last(), Some(Segment::Map { key }) if key == name)
    {
        segments.push(Segment::Map {
            key: name.to_owned(),
        });
    }
    while matches!(segments.last(), Some(Segment::Seq { .. })) {
        segments.pop();
    }
    let Some(Segment::Map { key }) = segments.pop() else {
        return None;
    };
    let mut parent = &mut *value;
    for segment in &segments {
        parent = match segment {
            Segment::Map { key } => parent.get_mut(key.as_str())?,
            Segment::Seq { index } => parent.get_mut(*index)?,
            _ => return None,
        };
    }
    parent.as_object_mut()?.remove(&key)?;
    let mut path = String::new();
    for segment in segments.iter().chain([&Segment::Map { key }]) {
        match segment {
            Segment::Seq { index } => path.push_str(&format!("[{index}]")),
            Segment::Map { key } if path.is_empty() => path.push_str(key),
            Segment::Map { key } => path.push_str(&format!(".{key}")),
            _ => {}
        }
    }
    Some(path)
}

/// Whether a problem of the checks is about a value already reported and taken out.
fn under(problem: &str, removed: &[String]) -> bool {
    removed.iter().any(|r| {
        problem
            .strip_prefix(r.as_str())
            .is_some_and(|rest| rest.starts_with([':', '.', '[']))
    })
}

/// Parses YAML text into the file layer only (no defaults, no validation).
pub fn parse_file(text: &str) -> Result<FileConfig, ConfigError> {
    let parsed = parse(text)?;
    if parsed.problems.is_empty() {
        Ok(parsed.file)
    } else {
        Err(ConfigError::Invalid(parsed.problems))
    }
}

/// Every problem: the shape's, then the checks' on what remains.
fn finish<T>(parsed: Parsed, built: Result<T, Vec<String>>) -> Result<T, ConfigError> {
    let mut problems = parsed.problems;
    match built {
        Ok(value) if problems.is_empty() => return Ok(value),
        Ok(_) => {}
        Err(more) => problems.extend(more.into_iter().filter(|p| !under(p, &parsed.removed))),
    }
    Err(ConfigError::Invalid(problems))
}

/// Loads a configuration from YAML text, with overrides applied on top.
pub fn load_str(text: &str, overrides: &Overrides) -> Result<Config, ConfigError> {
    let mut parsed = parse(text)?;
    let file = std::mem::take(&mut parsed.file);
    let built = build(file, overrides);
    finish(parsed, built)
}

fn read(path: Option<&Path>) -> Result<String, ConfigError> {
    match path {
        Some(path) => std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        }),
        None => Ok(String::new()),
    }
}

/// Loads a configuration from an optional file, with overrides applied on top.
pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    load_str(&read(path)?, overrides)
}

/// Loads only the store settings (for `idemproxy migrate`, which needs no upstream).
pub fn load_store(path: Option<&Path>, overrides: &Overrides) -> Result<StoreConfig, ConfigError> {
    let mut parsed = parse(&read(path)?)?;
    let file = std::mem::take(&mut parsed.file);
    let built = build_store_only(file, overrides);
    finish(parsed, built)
}

#[cfg(test)]
#[path = "load_identity_tests.rs"]
mod identity_tests;
#[cfg(test)]
#[path = "load_section_tests.rs"]
mod section_tests;
#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
