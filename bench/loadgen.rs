//! A small HTTP load generator for idemproxy's benchmark.
//!
//! Why not oha or wrk: every request needs its own `Idempotency-Key` (or one from a pool,
//! for replays), and latency must be measured from the *intended* send time in open-loop
//! mode, or a slow server hides its queueing (coordinated omission).
//!
//! - closed loop (`--concurrency C`): C workers, each sending as soon as the last answer
//!   came back — the maximum throughput;
//! - open loop (`--rate R`): requests scheduled at a constant rate whatever the server
//!   does; latency counted from each request's scheduled time.
//!
//! Prints one JSON line: requests, errors, throughput and latency percentiles.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

/// A finite number above zero (a rate or a duration); anything else would make the pacing
/// interval or the run's end meaningless.
fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number above zero")),
    }
}

/// A finite number, zero or above.
fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number, zero or above")),
    }
}

#[derive(Parser, Clone)]
struct Args {
    /// Target URL.
    #[arg(long)]
    url: String,
    #[arg(long, default_value = "POST")]
    method: String,
    #[arg(
        long,
        default_value = r#"{"amount":100,"currency":"RUB","recipient":"shop","purpose":"order"}"#
    )]
    body: String,
    /// `none`, `unique` (a new key per request, `{prefix}-{n}`), `random` (a new random
    /// UUIDv4 per request, as payment SDKs make them: each lands on a random page of the
    /// key index, as the seed pair's random keys do) or `pool` (keys from a pool of
    /// --key-pool).
    #[arg(long, default_value = "unique")]
    keys: String,
    #[arg(long, default_value_t = 1000)]
    key_pool: u64,
    /// Prefix that keeps keys of different runs apart.
    #[arg(long, default_value = "k")]
    key_prefix: String,
    #[arg(long, default_value = "bench")]
    client_id: String,
    /// Spread requests over this many client ids (`{client-id}-{i}`; a key always with the
    /// same one): a distributed store places each client's keys on one node.
    #[arg(long, default_value_t = 1)]
    clients: u64,
    /// Closed loop with this many workers.
    #[arg(long)]
    concurrency: Option<usize>,
    /// Open loop at this many requests per second.
    #[arg(long, value_parser = positive)]
    rate: Option<f64>,
    /// Open loop: most requests in flight at once.
    #[arg(long, default_value_t = 512)]
    max_in_flight: usize,
    /// Seconds to measure.
    #[arg(long, default_value_t = 10.0, value_parser = positive)]
    duration: f64,
    /// Seconds to run before measuring.
    #[arg(long, default_value_t = 1.0, value_parser = non_negative)]
    warmup: f64,
    #[arg(long, default_value = "run")]
    label: String,
}

#[derive(Default)]
struct Stats {
    hist: Option<Histogram<u64>>,
    statuses: BTreeMap<u16, u64>,
    errors: u64,
    replayed: u64,
}

struct Shared {
    args: Args,
    client: Client<HttpConnector, Full<Bytes>>,
    next: AtomicU64,
    /// Differs per run, so that `random` keys of two runs never meet.
    seed: u64,
    stats: Mutex<Stats>,
    measure_from: Instant,
    measure_until: Instant,
}

impl Shared {
    /// The next request's client id and key.
    fn key(&self) -> (String, Option<String>) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let i = match self.args.keys.as_str() {
            "pool" => n % self.args.key_pool.max(1),
            _ => n,
        };
        let client = if self.args.clients > 1 {
            format!("{}-{}", self.args.client_id, i % self.args.clients)
        } else {
            self.args.client_id.clone()
        };
        let key = match self.args.keys.as_str() {
            "none" => None,
            "random" => Some(uuid_v4(self.seed ^ n)),
            _ => Some(format!("{}-{i}", self.args.key_prefix)),
        };
        (client, key)
    }

    async fn one(&self, intended: Instant) {
        let mut req = http::Request::builder()
            .method(self.args.method.as_str())
            .uri(&self.args.url)
            .header("content-type", "application/json");
        let (client, key) = self.key();
        req = req.header("x-client-id", client);
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        let body = if self.args.method == "GET" {
            Bytes::new()
        } else {
            Bytes::from(self.args.body.clone())
        };
        let req = req.body(Full::new(body)).unwrap();
        let result = self.client.request(req).await;
        let outcome = match result {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let replayed = resp
                    .headers()
                    .get("idempotent-replayed")
                    .is_some_and(|v| v == "true");
                match resp.into_body().collect().await {
                    Ok(_) => Ok((status, replayed)),
                    Err(_) => Err(()),
                }
            }
            Err(_) => Err(()),
        };
        let done = Instant::now();
        if intended < self.measure_from || intended >= self.measure_until {
            return;
        }
        let mut stats = self.stats.lock().unwrap();
        match outcome {
            Ok((status, replayed)) => {
                *stats.statuses.entry(status).or_default() += 1;
                stats.replayed += u64::from(replayed);
                let micros = done.duration_since(intended).as_micros() as u64;
                let _ = stats.hist.as_mut().unwrap().record(micros.max(1));
            }
            Err(()) => stats.errors += 1,
        }
    }
}

/// Sends at a constant rate. tokio's timer ticks in whole milliseconds, which would send
/// the requests of each millisecond in one burst and charge every one of them up to 1 ms
/// of the generator's own lateness; so a plain OS thread paces the sends with
/// `thread::sleep` (timer slack lowered to 1 µs where the kernel allows) and hands each
/// request to the runtime at its intended time.
async fn open_loop(shared: &Arc<Shared>, start: Instant, rate: f64) {
    let permits = Arc::new(tokio::sync::Semaphore::new(shared.args.max_in_flight));
    let interval = Duration::from_secs_f64(1.0 / rate);
    let runtime = tokio::runtime::Handle::current();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let pacer_shared = Arc::clone(shared);
    let pacer = std::thread::spawn(move || {
        // Best effort: the default slack (50 µs) makes sleeps that much late.
        let _ = std::fs::write("/proc/thread-self/timerslack_ns", "1000");
        let start = start.into_std();
        let until = pacer_shared.measure_until.into_std();
        let mut i: u32 = 0;
        loop {
            let intended = start + interval * i;
            if intended >= until {
                break;
            }
            let now = std::time::Instant::now();
            if intended > now {
                std::thread::sleep(intended - now);
            }
            let (shared, permits, done) = (
                Arc::clone(&pacer_shared),
                Arc::clone(&permits),
                done_tx.clone(),
            );
            runtime.spawn(async move {
                // Waiting for a permit delays the send, and that delay counts as latency.
                let permit = permits.acquire_owned().await.unwrap();
                shared.one(Instant::from_std(intended)).await;
                drop((permit, done));
            });
            i += 1;
        }
    });
    // Every task holds a sender: the channel closes when the pacer and all sends are done.
    while done_rx.recv().await.is_some() {}
    pacer.join().unwrap();
}

/// A version-4 UUID from `x` (two rounds of splitmix64): random enough to scatter keys over
/// the index like an SDK's, cheap enough not to be what the load generator measures.
fn uuid_v4(x: u64) -> String {
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    let (a, b) = (mix(x), mix(x ^ 0x5555_5555_5555_5555));
    let v = (u128::from(a) << 64 | u128::from(b)) & !(0xf000 << 64) & !(0xc000 << 48)
        | (0x4000 << 64)
        | (0x8000 << 48);
    let h = format!("{v:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let pool = args.concurrency.unwrap_or(args.max_in_flight);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(pool)
        .build(connector);
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let measure_until = measure_from + Duration::from_secs_f64(args.duration);
    let shared = Arc::new(Shared {
        args: args.clone(),
        client,
        next: AtomicU64::new(0),
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32),
        stats: Mutex::new(Stats {
            hist: Some(Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()),
            ..Default::default()
        }),
        measure_from,
        measure_until,
    });

    if let Some(rate) = args.rate {
        open_loop(&shared, start, rate).await;
    } else {
        let workers = args.concurrency.unwrap_or(16);
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..workers {
            let shared = Arc::clone(&shared);
            tasks.spawn(async move {
                loop {
                    let now = Instant::now();
                    if now >= shared.measure_until {
                        break;
                    }
                    shared.one(now).await;
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    }

    let stats = shared.stats.lock().unwrap();
    let hist = stats.hist.as_ref().unwrap();
    let ok = hist.len();
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    let statuses: BTreeMap<String, u64> = stats
        .statuses
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    let report = serde_json::json!({
        "label": args.label,
        "mode": if args.rate.is_some() { "open" } else { "closed" },
        "requests": ok,
        "errors": stats.errors,
        "replayed": stats.replayed,
        "rps": ok as f64 / args.duration,
        "p50_ms": ms(0.5),
        "p99_ms": ms(0.99),
        "p999_ms": ms(0.999),
        "statuses": statuses,
    });
    println!("{report}");
}
