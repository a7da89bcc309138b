//! Route patterns (`/payments/{id}/refunds`, `/api/*`); the table that picks a policy from
//! them is [`crate::config::RouteTable`].
//!
//! Matching is on the normalised path (see [`crate::path`]), segment by segment, first route
//! wins. Literal segments match without regard to ASCII case (many frameworks route
//! `/Payments` to `/payments`), and what a match yields is the path in the route's own
//! spelling: that is what is fingerprinted and forwarded, so what was protected is what
//! executes. A request that matches a path but not its methods is not protected: it is
//! passed through.

use std::borrow::Cow;

use crate::path::normalize_segment;

/// One segment of a compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// In normal form (see [`crate::path`]).
    Literal(String),
    Param,
}

/// A compiled path pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    /// The pattern in normal form, as `check-config` prints it.
    source: String,
    segments: Vec<Segment>,
    /// Whether the pattern ended in `/*`: any remaining segments match.
    prefix: bool,
}

/// What a pattern makes of a normalised path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved<'a> {
    /// Not this route's path.
    No,
    /// This route's path, with its literal segments in the route's spelling.
    Path(Cow<'a, str>),
    /// It would be, were the `;` parameters of a literal segment ignored (as some servers
    /// do): refused, since protecting or passing it would each be a guess.
    PathParameters,
}

impl PathPattern {
    /// Compiles a pattern; the error says what is wrong with it. Literal segments are
    /// normalised like request paths, and repeated or trailing slashes dropped.
    pub fn parse(source: &str) -> Result<Self, String> {
        let Some(rest) = source.strip_prefix('/') else {
            return Err(format!("`{source}` must start with `/`"));
        };
        let mut segments = Vec::new();
        let mut prefix = false;
        let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
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
            } else if part.contains(';') {
                return Err(format!(
                    "`{source}`: segment `{part}` carries `;` parameters; routes match paths without them"
                ));
            } else {
                let literal = normalize_segment(part).map_err(|e| format!("`{source}`: {e}"))?;
                if literal == "." || literal == ".." {
                    return Err(format!(
                        "`{source}`: `.` and `..` segments are resolved away in request paths, so they can never match"
                    ));
                }
                segments.push(Segment::Literal(literal));
            }
        }
        let mut normal = String::new();
        let mut params = parts.iter().filter(|p| p.starts_with('{'));
        for segment in &segments {
            normal.push('/');
            match segment {
                Segment::Literal(lit) => normal.push_str(lit),
                Segment::Param => normal.push_str(params.next().copied().unwrap_or("{}")),
            }
        }
        if prefix {
            normal.push_str("/*");
        }
        if normal.is_empty() {
            normal.push('/');
        }
        Ok(Self {
            source: normal,
            segments,
            prefix,
        })
    }

    /// Whether a normalised `path` (without the query) matches.
    pub fn matches(&self, path: &str) -> bool {
        matches!(self.resolve(path), Resolved::Path(_))
    }

    /// What this pattern makes of a normalised `path` (see [`Resolved`]).
    pub fn resolve<'a>(&self, path: &'a str) -> Resolved<'a> {
        let Some(rest) = path.strip_prefix('/') else {
            return Resolved::No;
        };
        if rest.is_empty() {
            // "/" has no segments: only a pattern of "/" or "/*" takes it.
            return if self.segments.is_empty() {
                Resolved::Path(Cow::Borrowed(path))
            } else {
                Resolved::No
            };
        }
        let mut parts = rest.split('/');
        let mut exact = true;
        let mut parameters = false;
        for segment in &self.segments {
            let Some(part) = parts.next() else {
                return Resolved::No;
            };
            match segment {
                Segment::Literal(lit) => {
                    let (name, params) = match part.split_once(';') {
                        Some((name, _)) => (name, true),
                        None => (part, false),
                    };
                    if !name.eq_ignore_ascii_case(lit) {
                        return Resolved::No;
                    }
                    parameters |= params;
                    exact &= name == lit;
                }
                Segment::Param if part.is_empty() => return Resolved::No,
                Segment::Param => {}
            }
        }
        let remainder: Vec<&str> = parts.collect();
        if !self.prefix && !remainder.is_empty() {
            return Resolved::No;
        }
        if parameters {
            return Resolved::PathParameters;
        }
        if exact {
            return Resolved::Path(Cow::Borrowed(path));
        }
        // Respelled: the route's literals, the request's parameters and remainder.
        let mut out = String::with_capacity(path.len());
        for (segment, part) in self.segments.iter().zip(rest.split('/')) {
            out.push('/');
            match segment {
                Segment::Literal(lit) => out.push_str(lit),
                Segment::Param => out.push_str(part),
            }
        }
        for part in remainder {
            out.push('/');
            out.push_str(part);
        }
        Resolved::Path(Cow::Owned(out))
    }

    /// Whether every path this pattern matches is also matched by `earlier` (so that,
    /// listed after it with the same methods, this one never applies).
    pub fn is_shadowed_by(&self, earlier: &PathPattern) -> bool {
        if earlier.segments.len() > self.segments.len() {
            return false;
        }
        let covered = earlier
            .segments
            .iter()
            .zip(&self.segments)
            .all(|(e, s)| match (e, s) {
                (Segment::Param, _) => true,
                (Segment::Literal(a), Segment::Literal(b)) => a.eq_ignore_ascii_case(b),
                (Segment::Literal(_), Segment::Param) => false,
            });
        if !covered {
            return false;
        }
        if earlier.prefix {
            return true;
        }
        earlier.segments.len() == self.segments.len() && !self.prefix
    }

    /// The pattern in normal form.
    pub fn as_str(&self) -> &str {
        &self.source
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
    }

    /// Literals match in any ASCII case, and the match is spelled the route's way.
    #[test]
    fn respelled_in_the_routes_case() {
        let pat = p("/payments/{id}/refunds");
        assert_eq!(
            pat.resolve("/PAYMENTS/Ab1/Refunds"),
            Resolved::Path(Cow::Owned("/payments/Ab1/refunds".into()))
        );
        assert!(matches!(
            pat.resolve("/payments/Ab1/refunds"),
            Resolved::Path(Cow::Borrowed(_))
        ));
        assert_eq!(
            p("/api/*").resolve("/API/x/Y"),
            Resolved::Path(Cow::Owned("/api/x/Y".into()))
        );
    }

    /// `;` parameters on a literal segment make the path refused, not passed or protected.
    #[test]
    fn path_parameters_are_refused() {
        assert_eq!(
            p("/payments").resolve("/payments;jsessionid=1"),
            Resolved::PathParameters
        );
        assert_eq!(
            p("/payments/{id}").resolve("/payments/1;v=2"),
            Resolved::Path(Cow::Borrowed("/payments/1;v=2"))
        );
        assert_eq!(p("/payments").resolve("/other;x"), Resolved::No);
    }

    /// Patterns are normalised like paths: a trailing or doubled slash changes nothing.
    #[test]
    fn patterns_are_normalised() {
        assert_eq!(p("/payments/").as_str(), "/payments");
        assert_eq!(p("//pay%6dents//{id}/").as_str(), "/payments/{id}");
        assert_eq!(p("/").as_str(), "/");
        assert!(p("/payments/").matches("/payments"));
    }

    /// Shadowing: an earlier pattern that matches every path of a later one.
    #[test]
    fn shadowing() {
        assert!(p("/payments").is_shadowed_by(&p("/*")));
        assert!(p("/payments/{id}").is_shadowed_by(&p("/payments/*")));
        assert!(p("/payments/7").is_shadowed_by(&p("/payments/{id}")));
        assert!(p("/payments").is_shadowed_by(&p("/Payments")));
        assert!(p("/payments/*").is_shadowed_by(&p("/payments/*")));
        assert!(!p("/payments/{id}").is_shadowed_by(&p("/payments/7")));
        assert!(!p("/payments/*").is_shadowed_by(&p("/payments/{id}")));
        assert!(!p("/payments").is_shadowed_by(&p("/payments/{id}")));
        assert!(!p("/a/b").is_shadowed_by(&p("/a")));
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
        for bad in [
            "payments", "/a/*/b", "/a/{}", "/a/x{id}", "/a/{i-d}", "/a/../b", "/a/%2F", "/a;b",
        ] {
            assert!(PathPattern::parse(bad).is_err(), "{bad}");
        }
    }
}
