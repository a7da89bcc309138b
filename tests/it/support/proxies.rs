//! The proxy under test: in this process through the library (`TestProxy`), or as the real
//! binary in a process of its own (`ProxyProcess`) for SIGKILL and SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use idemproxy::app::App;
use idemproxy::config::Overrides;
use idemproxy::proxy::Proxy;
use idemproxy::store::AnyStore;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The `idemproxy` binary running as its own process, for SIGKILL and SIGTERM tests.
pub struct ProxyProcess {
    pub addr: SocketAddr,
    /// Its admin listener (health, readiness, metrics).
    pub admin: SocketAddr,
    pub child: tokio::process::Child,
    pub log: std::path::PathBuf,
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    free_listener().local_addr().unwrap().port()
}

/// A listener on a free loopback port; dropping it frees the port again.
fn free_listener() -> std::net::TcpListener {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap()
}

impl ProxyProcess {
    /// Starts the binary on `yaml` (`{upstream}`, `{db}` substituted; `{listen}` and
    /// `{admin}` get free ports, and the admin listener is put on `{admin}` when `yaml`
    /// does not say where) and waits until it accepts connections.
    pub async fn spawn(yaml: &str, upstream: &Upstream, db: &Backend) -> Self {
        Self::spawn_with(yaml, upstream, db, &[]).await
    }

    /// Like `spawn`, with more arguments for `serve` (e.g. `--migrate`).
    pub async fn spawn_with(yaml: &str, upstream: &Upstream, db: &Backend, args: &[&str]) -> Self {
        Self::spawn_wrapped(yaml, upstream, db, args, &[]).await
    }

    /// Like `spawn_with`, the binary started through `wrapper` (a program and its
    /// arguments, which must run the binary it is given after them, e.g. `unshare`).
    pub async fn spawn_wrapped(
        yaml: &str,
        upstream: &Upstream,
        db: &Backend,
        args: &[&str],
        wrapper: &[&str],
    ) -> Self {
        // Both held open while choosing, so the two ports cannot be the same one (two
        // `free_port()` calls in a row can be handed the same port back).
        let held = [free_listener(), free_listener()];
        let [port, admin] = held.each_ref().map(|l| l.local_addr().unwrap().port());
        drop(held);
        // Not the default port: processes of tests running in parallel would share it.
        let yaml = if yaml.contains("admin_listen:") {
            yaml.to_owned()
        } else {
            format!("admin_listen: \"{{admin}}\"\n{yaml}")
        };
        let text = yaml
            .replace("{store}", &db.store_yaml())
            .replace("{upstream}", &upstream.url())
            .replace("{admin}", &format!("127.0.0.1:{admin}"));
        let dir =
            std::env::temp_dir().join(format!("idemproxy-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("config.yaml");
        std::fs::write(&config, text).unwrap();
        let log = dir.join("stderr.log");
        let binary = env!("CARGO_BIN_EXE_idemproxy");
        let mut command = match wrapper {
            [program, rest @ ..] => {
                let mut c = tokio::process::Command::new(program);
                c.args(rest).arg(binary);
                c
            }
            [] => tokio::process::Command::new(binary),
        };
        let child = command
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(args)
            .env_remove("DATABASE_URL")
            .env("RUST_LOG", "info")
            // Several server threads whatever the machine, so that connections (and the
            // drain on SIGTERM) are spread over threads as in production.
            .env("TOKIO_WORKER_THREADS", "3")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let up = eventually(Duration::from_secs(20), || async move {
            tokio::net::TcpStream::connect(addr).await.ok().map(|_| ())
        })
        .await;
        assert!(
            up.is_some(),
            "the proxy process did not start; see {}",
            log.display()
        );
        let admin: SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
        ProxyProcess {
            addr,
            admin,
            child,
            log,
        }
    }

    /// The configuration file it was started with.
    pub fn config_file(&self) -> std::path::PathBuf {
        self.log.with_file_name("config.yaml")
    }

    /// The process's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The directory holding its configuration and log.
    pub fn dir(&self) -> &std::path::Path {
        self.log.parent().unwrap_or(&self.log)
    }

    /// The process id (0 once it has exited).
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// SIGKILL: no cleanup, no drain — a crash.
    pub async fn kill(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM: the orchestrator's polite stop.
    pub fn terminate(&self) {
        let pid = self.child.id().expect("still running");
        let status = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(self.dir());
    }
}

/// A proxy served on 127.0.0.1 by the library's own `server::run`.
pub struct TestProxy {
    pub addr: SocketAddr,
    /// The admin listener (health, metrics, admin API).
    pub admin: SocketAddr,
    pub metrics: Arc<idemproxy::metrics::Metrics>,
    shutdown: Option<oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<bool>,
    /// The admin listener and the background loops (the sweep, the unresolved-keys gauge
    /// and, when configured, the reconciler), started as `serve` starts them.
    app: Option<App<AnyStore>>,
}

impl TestProxy {
    /// Starts a proxy and its admin listener on `yaml` (`{store}` and `{upstream}` are
    /// substituted).
    pub async fn spawn(yaml: &str, upstream: &Upstream, db: &Backend) -> Self {
        let text = yaml
            .replace("{store}", &db.store_yaml())
            .replace("{upstream}", &upstream.url());
        let config = Arc::new(
            idemproxy::config::load_str(&text, &Overrides::default())
                .expect("test config is valid"),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let admin_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = admin_listener.local_addr().unwrap();
        let proxy = Proxy::new(Arc::clone(&config), AnyStore::open(&config.store).unwrap());
        let metrics = Arc::clone(proxy.metrics());
        let app = Some(App::start(proxy.clone(), admin_listener));
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(idemproxy::server::run(
            listener,
            proxy,
            async {
                let _ = rx.await;
            },
            Duration::from_secs(10),
        ));
        TestProxy {
            addr,
            admin,
            metrics,
            shutdown: Some(tx),
            handle,
            app,
        }
    }

    /// Stops accepting, drains, and waits for the server to return.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.handle).await;
        if let Some(app) = self.app.take() {
            app.stop().await;
        }
    }
}

/// The value of one series on `/metrics` (`name{labels}` as rendered), 0 when absent.
pub async fn metric(admin: SocketAddr, series: &str) -> f64 {
    let metrics = TestClient::at(admin).send("GET", "/metrics", &[], "").await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Replays this proxy answered from memory so far, as `/metrics` shows them.
pub async fn cache_hits(proxy: &TestProxy) -> u64 {
    let metrics = TestClient::at(proxy.admin)
        .send("GET", "/metrics", &[], "")
        .await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("idemproxy_replay_cache_hits_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no replay cache counter in {text}"))
}
