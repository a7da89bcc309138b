//! The route table: the configuration's routes in order, and what they make of a request
//! (first match wins, on the normalised path; see [`crate::route`] for the patterns).

use std::borrow::Cow;
use std::sync::Arc;

use http::Method;

use super::Route;
use crate::path::{PathError, normalize};
use crate::route::Resolved;

/// What the route table makes of a request.
#[derive(Debug)]
pub enum Lookup<'r, 'p> {
    /// No route protects this method and path.
    Unrouted,
    /// This route, and the path to fingerprint and forward.
    Route(&'r Arc<Route>, Cow<'p, str>),
    /// The path is one the proxy cannot safely protect or pass (see [`Resolved`]).
    Refused(PathError),
}

/// The routes in configuration order.
#[derive(Debug, Clone)]
pub struct RouteTable {
    /// Shared so that a detached execution can hold its route without copying it.
    routes: Vec<Arc<Route>>,
    /// Every method some route protects: only these need the path normalised.
    methods: Vec<Method>,
}

impl RouteTable {
    /// Builds the table; routes are tried in order.
    pub fn new(routes: Vec<Route>) -> Self {
        let mut methods: Vec<Method> = Vec::new();
        for route in &routes {
            for method in &route.methods {
                if !methods.contains(method) {
                    methods.push(method.clone());
                }
            }
        }
        Self {
            routes: routes.into_iter().map(Arc::new).collect(),
            methods,
        }
    }

    /// Whether some route protects `method`: requests with other methods pass through
    /// untouched.
    pub fn guards(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// What protects a request with `method` on the raw `path` (as received, without the
    /// query): the path is normalised, then looked up. A path that cannot be normalised
    /// safely is refused only on a method some route protects; other methods pass.
    pub fn resolve<'p>(&self, method: &Method, path: &'p str) -> Lookup<'_, 'p> {
        if !self.guards(method) {
            return Lookup::Unrouted;
        }
        match normalize(path) {
            Err(e) => Lookup::Refused(e),
            Ok(Cow::Borrowed(normal)) => self.lookup(method, normal),
            Ok(Cow::Owned(normal)) => match self.lookup(method, &normal) {
                Lookup::Route(route, path) => Lookup::Route(route, Cow::Owned(path.into_owned())),
                Lookup::Unrouted => Lookup::Unrouted,
                Lookup::Refused(e) => Lookup::Refused(e),
            },
        }
    }

    /// The first route whose method and path both match the normalised `path`.
    pub fn lookup<'p>(&self, method: &Method, path: &'p str) -> Lookup<'_, 'p> {
        for route in &self.routes {
            if !route.methods.contains(method) {
                continue;
            }
            match route.pattern.resolve(path) {
                Resolved::No => {}
                Resolved::Path(path) => return Lookup::Route(route, path),
                Resolved::PathParameters => return Lookup::Refused(PathError::PathParameters),
            }
        }
        Lookup::Unrouted
    }

    /// The route that protects `method` on the raw `path`, if any (for tests and tools).
    pub fn route_for(&self, method: &Method, path: &str) -> Option<&Arc<Route>> {
        match self.resolve(method, path) {
            Lookup::Route(route, _) => Some(route),
            Lookup::Unrouted | Lookup::Refused(_) => None,
        }
    }

    /// All routes, in order.
    pub fn routes(&self) -> &[Arc<Route>] {
        &self.routes
    }

    /// The route called `name`, if one is configured now (a key's row names its route).
    pub fn named(&self, name: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|r| &*r.name == name)
    }

    /// The routes' names, in order (the label values of per-route series).
    pub fn names(&self) -> Vec<Arc<str>> {
        self.routes.iter().map(|r| Arc::clone(&r.name)).collect()
    }
}
