//! The overview: what this proxy is doing now, read from its own counters — the same
//! series `/metrics` exposes, sampled every few seconds so that rates cover the last
//! minute — and the unresolved keys counted by the store.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::html::esc;

/// How often the counters are sampled.
pub(super) const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// The window rates are taken over.
const WINDOW: Duration = Duration::from_secs(60);

/// Request outcomes that are the proxy's own errors (the rest are answers).
const ERROR_OUTCOMES: [&str; 5] = [
    "store_error",
    "upstream_error",
    "failed",
    "unreadable",
    "outcome_unknown",
];

/// The series the overview reads, at one moment.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Snapshot {
    pub executed: f64,
    pub replayed: f64,
    pub in_flight: f64,
    pub connections: f64,
    /// Error kind (`store: reserve`, `upstream: timeout`, …) → count since start.
    pub errors: BTreeMap<String, f64>,
    /// The store call latency histogram, all operations: bucket bound → cumulative count.
    pub store_buckets: BTreeMap<u64, f64>,
    pub store_count: f64,
    pub store_sum: f64,
}

impl Snapshot {
    /// Reads the classic text exposition (`Metrics::render_classic`).
    pub fn parse(text: &str) -> Self {
        let mut s = Snapshot::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, labels(rest.trim_end_matches('}'))),
                None => (series, Vec::new()),
            };
            let label = |k: &str| {
                labels
                    .iter()
                    .find(|(n, _)| n == k)
                    .map_or("", |(_, v)| v.as_str())
            };
            match name {
                "idemproxy_requests_total" => match label("outcome") {
                    "executed" => s.executed += value,
                    "replayed" => s.replayed += value,
                    o if ERROR_OUTCOMES.contains(&o) => {
                        *s.errors.entry(format!("request: {o}")).or_default() += value;
                    }
                    _ => {}
                },
                "idemproxy_store_errors_total" => {
                    *s.errors
                        .entry(format!("store: {}", label("op")))
                        .or_default() += value;
                }
                "idemproxy_upstream_errors_total" => {
                    *s.errors
                        .entry(format!("upstream: {}", label("kind")))
                        .or_default() += value;
                }
                "idemproxy_admission_refused_total" => {
                    *s.errors
                        .entry(format!("refused: {}", label("bound")))
                        .or_default() += value;
                }
                "idemproxy_detached_executions" => s.in_flight += value,
                "idemproxy_connections_open" => s.connections += value,
                "idemproxy_store_duration_seconds_bucket" => {
                    let le = label("le");
                    let bound = if le == "+Inf" {
                        u64::MAX
                    } else {
                        le.parse::<f64>().map_or(u64::MAX, |s| (s * 1e6) as u64)
                    };
                    *s.store_buckets.entry(bound).or_default() += value;
                }
                "idemproxy_store_duration_seconds_count" => s.store_count += value,
                "idemproxy_store_duration_seconds_sum" => s.store_sum += value,
                _ => {}
            }
        }
        s
    }
}

/// `name="value",…` with the exposition's escapes (`\"`, `\\`, `\n`).
fn labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some((name, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.push((name.trim_start_matches(',').trim().to_owned(), value));
        rest = &after[end..];
    }
    out
}

/// Samples of the counters, oldest first, covering a little more than the window.
#[derive(Default)]
pub(super) struct Samples {
    ring: Mutex<VecDeque<(Instant, Snapshot)>>,
}

impl Samples {
    /// Records the counters as they are now.
    pub fn record(&self, snapshot: Snapshot) {
        let now = Instant::now();
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        ring.push_back((now, snapshot));
        // Keep the newest sample at least a window old: it is the rates' base.
        while ring.len() > 2
            && ring
                .get(1)
                .is_some_and(|(t, _)| now.duration_since(*t) >= WINDOW)
        {
            ring.pop_front();
        }
    }

    /// The figures the overview shows: now against the oldest sample in the window.
    pub fn figures(&self, now: Snapshot) -> Figures {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let (elapsed, base) = ring
            .front()
            .map_or((Duration::ZERO, Snapshot::default()), |(t, s)| {
                (t.elapsed(), s.clone())
            });
        drop(ring);
        let secs = elapsed.as_secs_f64();
        let per_minute = |now: f64, then: f64| {
            if secs < 1.0 {
                None
            } else {
                Some(((now - then).max(0.0) * 60.0 / secs).round())
            }
        };
        let store_calls = now.store_count - base.store_count;
        let store_mean_ms =
            (store_calls > 0.0).then(|| (now.store_sum - base.store_sum) * 1000.0 / store_calls);
        let store_p99_ms = (store_calls > 0.0).then(|| {
            let target = store_calls * 0.99;
            now.store_buckets
                .iter()
                .find(|(bound, count)| {
                    *count - base.store_buckets.get(bound).copied().unwrap_or(0.0) >= target
                })
                .map_or(f64::INFINITY, |(bound, _)| *bound as f64 / 1000.0)
        });
        let errors = now
            .errors
            .iter()
            .map(|(kind, total)| ErrorFigure {
                kind: kind.clone(),
                last_minute: (total - base.errors.get(kind).copied().unwrap_or(0.0)).max(0.0),
                total: *total,
            })
            .filter(|e| e.total > 0.0)
            .collect();
        Figures {
            window_seconds: secs.round(),
            in_flight: now.in_flight,
            connections: now.connections,
            executed_per_minute: per_minute(now.executed, base.executed),
            replayed_per_minute: per_minute(now.replayed, base.replayed),
            store_mean_ms,
            store_p99_ms: store_p99_ms.filter(|v| v.is_finite()),
            errors,
            unresolved: None,
            unresolved_by_route: Vec::new(),
            store_answers: true,
        }
    }
}

/// What the overview shows (and `/console/overview.json` sends to refresh it).
#[derive(Serialize)]
pub(super) struct Figures {
    pub window_seconds: f64,
    pub in_flight: f64,
    pub connections: f64,
    pub executed_per_minute: Option<f64>,
    pub replayed_per_minute: Option<f64>,
    pub store_mean_ms: Option<f64>,
    /// The bucket bound under which 99 % of the window's store calls finished.
    pub store_p99_ms: Option<f64>,
    pub errors: Vec<ErrorFigure>,
    pub unresolved: Option<u64>,
    pub unresolved_by_route: Vec<(String, u64)>,
    /// Whether the store answered the unresolved count.
    pub store_answers: bool,
}

#[derive(Serialize)]
pub(super) struct ErrorFigure {
    pub kind: String,
    pub last_minute: f64,
    pub total: f64,
}

fn figure(v: Option<f64>, unit: &str) -> String {
    match v {
        Some(v) if v.fract() == 0.0 => format!("{v:.0}{unit}"),
        Some(v) => format!("{v:.1}{unit}"),
        None => "—".to_owned(),
    }
}

/// The overview's main part; `data-figure` names what the script refreshes.
pub(super) fn render(f: &Figures) -> String {
    let mut out = String::new();
    let tile = |out: &mut String, id: &str, label: &str, value: String, note: &str| {
        let _ = write!(
            out,
            "<div class=\"tile\"><dt>{label}</dt><dd data-figure=\"{id}\">{}</dd><dd class=\"note\">{note}</dd></div>",
            esc(&value)
        );
    };
    out.push_str("<p class=\"lede\" aria-live=\"polite\">This replica's counters, refreshed every 5 s; rates over the last <span data-figure=\"window_seconds\">");
    let _ = write!(out, "{}", f.window_seconds);
    out.push_str("</span> s. Unresolved keys are counted in the store, for every replica.</p><dl class=\"tiles\">");
    tile(
        &mut out,
        "in_flight",
        "Keys in flight",
        figure(Some(f.in_flight), ""),
        "reserved, answer not yet stored",
    );
    tile(
        &mut out,
        "unresolved",
        "Unresolved keys",
        f.unresolved
            .map_or_else(|| "store unavailable".to_owned(), |n| n.to_string()),
        "lease ran out, outcome unknown",
    );
    tile(
        &mut out,
        "executed_per_minute",
        "Executions / min",
        figure(f.executed_per_minute, ""),
        "forwarded and answered",
    );
    tile(
        &mut out,
        "replayed_per_minute",
        "Replays / min",
        figure(f.replayed_per_minute, ""),
        "stored answers sent again",
    );
    tile(
        &mut out,
        "store_p99_ms",
        "Store latency p99",
        figure(f.store_p99_ms, " ms"),
        "every store call, last minute",
    );
    tile(
        &mut out,
        "store_mean_ms",
        "Store latency mean",
        figure(f.store_mean_ms, " ms"),
        "every store call, last minute",
    );
    tile(
        &mut out,
        "connections",
        "Client connections",
        figure(Some(f.connections), ""),
        "open now",
    );
    out.push_str("</dl><h2>The proxy's own errors</h2>");
    out.push_str("<table class=\"errors\"><caption>By kind, since this replica started</caption><thead><tr><th scope=\"col\">Kind</th><th scope=\"col\">Last minute</th><th scope=\"col\">Since start</th></tr></thead><tbody data-figure=\"errors\">");
    if f.errors.is_empty() {
        out.push_str("<tr><td colspan=\"3\">None.</td></tr>");
    }
    for e in &f.errors {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&e.kind),
            e.last_minute,
            e.total
        );
    }
    out.push_str("</tbody></table>");
    if !f.unresolved_by_route.is_empty() {
        out.push_str("<h2>Unresolved keys by route</h2><ul>");
        for (route, n) in &f.unresolved_by_route {
            let _ = write!(out, "<li>{}: {n}</li>", esc(route));
        }
        out.push_str("</ul><p><a href=\"/console/unresolved\">See the unresolved keys</a></p>");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The overview reads the series it shows from the exposition text.
    #[test]
    fn reads_the_exposition() {
        let text = "# HELP x\n\
            idemproxy_requests_total{route=\"pay\",outcome=\"executed\",status_class=\"2xx\"} 7\n\
            idemproxy_requests_total{route=\"a \\\"q\\\"\",outcome=\"executed\",status_class=\"5xx\"} 1\n\
            idemproxy_requests_total{route=\"pay\",outcome=\"replayed\",status_class=\"2xx\"} 3\n\
            idemproxy_requests_total{route=\"pay\",outcome=\"store_error\",status_class=\"5xx\"} 2\n\
            idemproxy_store_errors_total{op=\"reserve\"} 4\n\
            idemproxy_detached_executions 5\n\
            idemproxy_store_duration_seconds_bucket{op=\"reserve\",le=\"0.001\"} 90\n\
            idemproxy_store_duration_seconds_bucket{op=\"reserve\",le=\"+Inf\"} 100\n\
            idemproxy_store_duration_seconds_count{op=\"reserve\"} 100\n\
            idemproxy_store_duration_seconds_sum{op=\"reserve\"} 0.05\n";
        let s = Snapshot::parse(text);
        assert_eq!((s.executed, s.replayed, s.in_flight), (8.0, 3.0, 5.0));
        assert_eq!(s.errors["request: store_error"], 2.0);
        assert_eq!(s.errors["store: reserve"], 4.0);
        assert_eq!(s.store_buckets[&1000], 90.0);
        assert_eq!(s.store_buckets[&u64::MAX], 100.0);
        assert_eq!(
            labels("a=\"x\\\"y\",b=\"z\""),
            [("a".into(), "x\"y".into()), ("b".into(), "z".into())]
        );
    }
}
