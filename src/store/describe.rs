//! An error and its sources as one line, each cause once.
//!
//! tokio-postgres and deadpool each repeat their cause in their own message ("error
//! connecting to server: X: X"), so errors are described as one deduplicated chain.

use std::error::Error;

/// `err` and its sources, each cause once: a message that already ends with its source's
/// message is cut before it, and repeats are dropped.
pub fn describe(err: &(dyn Error + 'static)) -> String {
    let mut messages = Vec::new();
    let mut next: Option<&(dyn Error + 'static)> = Some(err);
    while let Some(e) = next {
        messages.push(e.to_string());
        next = e.source();
    }
    let mut parts: Vec<String> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let mut own = message.as_str();
        for later in &messages[i + 1..] {
            if let Some(cut) = own.strip_suffix(later.as_str()) {
                own = cut.trim_end_matches([':', ' ']);
                break;
            }
        }
        if !own.is_empty() && !parts.iter().any(|p| p == own) {
            parts.push(own.to_owned());
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)?;
            if let Some(inner) = &self.1 {
                write!(f, ": {inner}")?;
            }
            Ok(())
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn Error + 'static))
        }
    }

    /// A chain whose layers repeat their causes reads each cause once.
    #[test]
    fn each_cause_once() {
        let chain = Layer(
            "pool",
            Some(Box::new(Layer(
                "error connecting to server",
                Some(Box::new(Layer("Connection refused (os error 111)", None))),
            ))),
        );
        assert_eq!(
            describe(&chain),
            "pool: error connecting to server: Connection refused (os error 111)"
        );
    }
}
