//! `routes:` — which requests are protected, each with its policy.

use std::collections::HashSet;
use std::time::Duration;

use http::Method;

use super::Problems;
use super::policy::merge_policy;
use crate::config::file::{FileOnConflict, FilePolicy, FileRoute};
use crate::config::model::*;
use crate::config::policy::*;
use crate::route::PathPattern;

pub(super) fn build_routes(
    p: &mut Problems,
    routes: &[FileRoute],
    base: &Policy,
    store_timeout: Duration,
) -> Vec<Route> {
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for (i, r) in routes.iter().enumerate() {
        let at = format!("routes[{i}]");
        let Some(name) = r.name.clone().filter(|n| !n.is_empty()) else {
            p.push(format!("{at}.name"), "required");
            continue;
        };
        if !names.insert(name.clone()) {
            p.push(
                format!("{at}.name"),
                format!("`{name}` is used by an earlier route; names must be unique"),
            );
        }
        let pattern = match r.path.as_deref().map(PathPattern::parse) {
            Some(Ok(pattern)) => Some(pattern),
            Some(Err(e)) => {
                p.push(format!("{at}.path"), e);
                None
            }
            None => {
                p.push(format!("{at}.path"), "required");
                None
            }
        };
        let methods = build_methods(p, &at, r);
        let own = route_policy(r);
        let policy = merge_policy(p, &at, Some(base), &own, store_timeout);
        if let (Some(pattern), Some(policy)) = (pattern, policy) {
            out.push(Route {
                name: name.into(),
                methods,
                pattern,
                policy,
            });
        }
    }
    out
}

/// A route's `methods` (registered ones, in any case) and `extension_methods` (any other
/// method token, exactly as written: methods are case-sensitive).
fn build_methods(p: &mut Problems, at: &str, r: &FileRoute) -> Vec<Method> {
    let mut extensions = Vec::new();
    for (i, m) in r.extension_methods.iter().flatten().enumerate() {
        match Method::from_bytes(m.as_bytes()) {
            Err(_) => p.push(
                format!("{at}.extension_methods[{i}]"),
                format!("`{m}` is not a method name (letters, digits and `!#$%&'*+-.^_`|~`)"),
            ),
            Ok(method) if is_registered_method(&method) => p.push(
                format!("{at}.extension_methods[{i}]"),
                format!("`{m}` is a registered method: list it under `methods`"),
            ),
            Ok(method) => extensions.push(method),
        }
    }
    let mut methods = Vec::new();
    match &r.methods {
        None if extensions.is_empty() => methods.push(Method::POST),
        None => {}
        Some(list) if list.is_empty() && extensions.is_empty() => {
            p.push(format!("{at}.methods"), "must list at least one method");
        }
        Some(list) => {
            for (i, m) in list.iter().enumerate() {
                let upper = Method::from_bytes(m.to_ascii_uppercase().as_bytes());
                let exact = Method::from_bytes(m.as_bytes());
                match (upper, exact) {
                    (Ok(method), _) if is_registered_method(&method) => {
                        methods.push(method);
                    }
                    (_, Ok(method)) if extensions.contains(&method) => {}
                    _ => p.push(
                        format!("{at}.methods[{i}]"),
                        format!(
                            "`{m}` is not a registered HTTP method ({}); a misspelt method leaves the real one unprotected. List an extension method under `extension_methods`",
                            REGISTERED_METHODS.iter().map(Method::as_str).collect::<Vec<_>>().join(", ")
                        ),
                    ),
                }
            }
        }
    }
    for method in extensions {
        if !methods.contains(&method) {
            methods.push(method);
        }
    }
    methods
}

/// Warnings for routes that an earlier route shadows: for those methods the earlier
/// route matches every path the later one does, so the later one never applies to them.
pub(super) fn shadowed(routes: &[Route]) -> Vec<String> {
    let mut warnings = Vec::new();
    for (j, later) in routes.iter().enumerate() {
        let mut hidden: Vec<&Method> = Vec::new();
        let mut by = Vec::new();
        for (i, earlier) in routes[..j].iter().enumerate() {
            if !later.pattern.is_shadowed_by(&earlier.pattern) {
                continue;
            }
            let before = hidden.len();
            for method in &later.methods {
                if earlier.methods.contains(method) && !hidden.contains(&method) {
                    hidden.push(method);
                }
            }
            if hidden.len() > before {
                by.push(format!("routes[{i}] (`{}`)", earlier.name));
            }
        }
        if hidden.is_empty() {
            continue;
        }
        let methods: Vec<&str> = hidden.iter().map(|m| m.as_str()).collect();
        let reach = if hidden.len() == later.methods.len() {
            "it never applies"
        } else {
            "it never applies to those methods"
        };
        warnings.push(format!(
            "routes[{j}] (`{}`, {}) is shadowed for {} by {}, which matches every path it does: {reach}; put the more specific route first",
            later.name,
            later.pattern.as_str(),
            methods.join(", "),
            by.join(" and ")
        ));
    }
    warnings
}

/// The policy part of a route entry, in the shape of `defaults:`.
fn route_policy(r: &FileRoute) -> FilePolicy {
    FilePolicy {
        key_header: r.key_header.clone(),
        key_headers: r.key_headers.clone(),
        key_from: r.key_from.clone(),
        upstream_key: r.upstream_key.clone(),
        derived_key: r.derived_key.clone(),
        key_scope: r.key_scope.clone(),
        replayed_header: r.replayed_header.clone(),
        echo_key_header: r.echo_key_header.clone(),
        upstream_key_header: r.upstream_key_header.clone(),
        lease: r.lease,
        retention: r.retention,
        max_body: r.max_body,
        max_stored_response: r.max_stored_response,
        require_key: r.require_key,
        on_conflict: r.on_conflict.as_ref().map(|c| match c {
            FileOnConflict::Word(w) => FileOnConflict::Word(w.clone()),
            FileOnConflict::Spec(w) => {
                FileOnConflict::Spec(crate::config::file::FileWait { wait: w.wait })
            }
        }),
        store_headers: r.store_headers.clone(),
        release_on: r.release_on.clone(),
        fingerprint: r.fingerprint.clone(),
        recovery_probe: r.recovery_probe.clone(),
        on_ambiguous: r.on_ambiguous.clone(),
        ambiguous_statuses: r.ambiguous_statuses.clone(),
        takeover: r.takeover.clone(),
        errors: r.errors.clone(),
        console_body: r.console_body,
    }
}
