//! Route patterns (`/payments/{id}/refunds`, `/api/*`) and the table that picks a policy.
//!
//! Matching is on the raw request path, segment by segment, first route wins. A request
//! that matches a path but not its methods is not protected: it is passed through.

use std::sync::Arc;

use http::Method;

use crate::config::Route;

/// One segment of a compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
}

/// A compiled path pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    source: String,
    segments: Vec<Segment>,
    /// Whether the pattern ended in `/*`: any remaining segments match.
    prefix: bool,
}

impl PathPattern {
    /// Compiles a pattern; the error says what is wrong with it.
    pub fn parse(source: &str) -> Result<Self, String> {
        let Some(rest) = source.strip_prefix('/') else {
            return Err(format!("`{source}` must start with `/`"));
        };
        let mut segments = Vec::new();
        let mut prefix = false;
        let parts: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('/').collect()
        };
        for (i, part) in parts.iter().enumerate() {
            if *part == "*" {
                if i + 1 != parts.len() {
                    return Err(format!(
                        "`{source}`: `*` is only allowed as the last segment"
                    ));
                }
                prefix = true;
            } else if let Some(name) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(format!(
                        "`{source}`: parameter `{part}` needs a name of letters, digits or `_`"
                    ));
                }
                segments.push(Segment::Param);
            } else if part.contains(['{', '}', '*']) {
                return Err(format!(
                    "`{source}`: segment `{part}` mixes text with `{{`, `}}` or `*`; a parameter or `*` must be a whole segment"
                ));
            } else {
                segments.push(Segment::Literal((*part).to_owned()));
            }
        }
        Ok(Self {
            source: source.to_owned(),
            segments,
            prefix,
        })
    }

    /// Whether `path` (without the query) matches.
    pub fn matches(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let mut parts = if rest.is_empty() && !self.segments.is_empty() {
            // "/" has one empty segment; only a pattern of "/" or "/*" should take it.
            return false;
        } else if rest.is_empty() {
            return true;
        } else {
            rest.split('/')
        };
        for segment in &self.segments {
            let Some(part) = parts.next() else {
                return false;
            };
            match segment {
                Segment::Literal(lit) if lit == part => {}
                Segment::Literal(_) => return false,
                Segment::Param if part.is_empty() => return false,
                Segment::Param => {}
            }
        }
        self.prefix || parts.next().is_none()
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

/// The routes in configuration order.
#[derive(Debug, Clone)]
pub struct RouteTable {
    /// Shared so that a detached execution can hold its route without copying it.
    routes: Vec<Arc<Route>>,
}

impl RouteTable {
    /// Builds the table; routes are tried in order.
    pub fn new(routes: Vec<Route>) -> Self {
        Self {
            routes: routes.into_iter().map(Arc::new).collect(),
        }
    }

    /// The first route whose path and method both match.
    pub fn lookup(&self, method: &Method, path: &str) -> Option<&Arc<Route>> {
        self.routes
            .iter()
            .find(|r| r.methods.contains(method) && r.pattern.matches(path))
    }

    /// All routes, in order.
    pub fn routes(&self) -> &[Arc<Route>] {
        &self.routes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathPattern {
        PathPattern::parse(s).unwrap()
    }

    /// Literal segments match exactly, and only the whole path.
    #[test]
    fn literals() {
        assert!(p("/payments").matches("/payments"));
        assert!(!p("/payments").matches("/payments/1"));
        assert!(!p("/payments").matches("/payment"));
        assert!(!p("/payments").matches("/payments/"));
    }

    /// `{id}` takes exactly one non-empty segment.
    #[test]
    fn params() {
        let pat = p("/payments/{id}/refunds");
        assert!(pat.matches("/payments/42/refunds"));
        assert!(!pat.matches("/payments//refunds"));
        assert!(!pat.matches("/payments/42/43/refunds"));
    }

    /// A trailing `/*` matches the prefix itself and anything below it.
    #[test]
    fn prefixes() {
        let pat = p("/api/*");
        assert!(pat.matches("/api"));
        assert!(pat.matches("/api/x/y"));
        assert!(!pat.matches("/apix"));
        assert!(p("/*").matches("/"));
        assert!(p("/*").matches("/anything/at/all"));
    }

    /// Malformed patterns are rejected with a reason.
    #[test]
    fn bad_patterns() {
        for bad in ["payments", "/a/*/b", "/a/{}", "/a/x{id}", "/a/{i-d}"] {
            assert!(PathPattern::parse(bad).is_err(), "{bad}");
        }
    }
}
