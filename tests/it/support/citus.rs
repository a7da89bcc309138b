//! Throwaway Citus clusters — a coordinator and two workers (`tests/citus`) — for the tests
//! that run the key table distributed, and for faults on one node of it. Stopped and
//! removed on drop.

use std::process::Command;

use super::TempDir;

/// A running coordinator and two workers.
pub struct Citus {
    dir: TempDir,
    url: String,
}

fn script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/citus")
}

impl Citus {
    /// Starts a cluster of its own (about 3 s).
    pub fn start() -> Self {
        let dir = TempDir::new("citus");
        let out = Command::new(script())
            .arg("start")
            .arg(&dir.0)
            .output()
            .expect("running tests/citus");
        assert!(
            out.status.success(),
            "starting a Citus cluster (is Citus installed? ../shared/citus/build.sh): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let url = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        Citus { dir, url }
    }

    /// The coordinator's URL (database `postgres`).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The port `node` (coordinator, worker1…) listens on.
    pub fn port(&self, node: &str) -> u16 {
        std::fs::read_to_string(self.dir.join(&format!("{node}.port")))
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no port for {node}"))
    }

    /// Runs `tests/citus <action> DIR <node>` (stop-node, start-node, add-worker…).
    pub fn node(&self, action: &str, node: &str) -> String {
        let out = Command::new(script())
            .arg(action)
            .arg(&self.dir.0)
            .arg(node)
            .output()
            .expect("running tests/citus");
        assert!(
            out.status.success(),
            "tests/citus {action} {node}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Citus {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("stop").arg(&self.dir.0).output();
    }
}
