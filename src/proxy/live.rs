//! What a configuration reload (SIGHUP) changes: the route table — routes and their
//! policies. It is swapped whole, at once, for new requests; a request in flight holds its
//! `Arc<Route>` and finishes under the policy it started with. Everything else (listeners,
//! the store, the upstream, limits, the background work) is fixed at start, and a reload
//! that changes it says so instead of half-applying it.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use crate::config::Config;
use crate::config::RouteTable;

/// The route table in force, shared by every server thread.
pub(crate) struct LiveRoutes(RwLock<Arc<RouteTable>>);

impl LiveRoutes {
    pub fn new(table: RouteTable) -> Self {
        LiveRoutes(RwLock::new(Arc::new(table)))
    }

    /// The table new requests are routed by.
    pub fn current(&self) -> Arc<RouteTable> {
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn replace(&self, table: RouteTable) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(table);
    }
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Routes now in force.
    pub routes: usize,
    /// Sections of the file that changed but only take effect at a restart.
    pub needs_restart: Vec<String>,
}

/// Sections the route table is built from: the ones a reload applies.
const LIVE_SECTIONS: [&str; 2] = ["routes", "defaults"];

/// The top-level sections of the printed configurations that differ, but for the live
/// ones. The printed form spells every default out, so a section that reads the same
/// is the same.
pub(crate) fn fixed_changes(old: &Config, new: &Config) -> Vec<String> {
    let (old_sections, new_sections) = (sections(&old.to_string()), sections(&new.to_string()));
    let mut changed: Vec<String> = old_sections
        .keys()
        .chain(new_sections.keys())
        .filter(|k| !LIVE_SECTIONS.contains(&k.as_str()))
        .filter(|k| old_sections.get(*k) != new_sections.get(*k))
        .cloned()
        .collect();
    // The printed form keeps secrets out; compare them themselves.
    if old.admin_token != new.admin_token {
        changed.push("admin_token".into());
    }
    if old.admin_tokens != new.admin_tokens {
        changed.push("admin_tokens".into());
    }
    changed.sort();
    changed.dedup();
    changed
}

/// A printed configuration's top-level sections (`key:` or a commented `# key:`), each
/// with its text.
fn sections(printed: &str) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in printed.lines() {
        let top = !line.starts_with([' ', '\t', '-']);
        if top {
            let bare = line.trim_start_matches("# ");
            if let Some((key, _)) = bare.split_once(':')
                && !key.is_empty()
                && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            {
                current = Some(key.to_owned());
            }
        }
        if let Some(key) = &current {
            let text = out.entry(key.clone()).or_default();
            text.push_str(line);
            text.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Overrides, load_str};

    fn config(text: &str) -> Config {
        load_str(text, &Overrides::default()).unwrap()
    }

    const BASE: &str =
        "upstream:\n  url: http://127.0.0.1:3000\nroutes:\n  - name: a\n    path: /a\n";

    #[test]
    fn routes_and_defaults_are_live_the_rest_is_named() {
        let old = config(BASE);
        let routes = config(&format!(
            "{BASE}  - name: b\n    path: /b\ndefaults:\n  lease: 30s\n"
        ));
        assert!(fixed_changes(&old, &routes).is_empty());
        let moved = config(&format!(
            "listen: 127.0.0.1:9999\n{}",
            BASE.replace("3000", "3001")
        ));
        assert_eq!(fixed_changes(&old, &moved), ["listen", "upstream"]);
        let token = config(&format!("admin_token: s3cret\n{BASE}"));
        assert_eq!(fixed_changes(&old, &token), ["admin_token"]);
        let sweep = config(&format!("sweep:\n  interval: 5m\n{BASE}"));
        assert_eq!(fixed_changes(&old, &sweep), ["sweep"]);
    }
}
