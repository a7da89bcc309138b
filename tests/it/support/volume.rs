//! A small volume of the test's own — a tmpfs mounted on a temporary directory (the tests
//! run as root in CI) — that a test fills to the last byte and frees again: a real full
//! disk under a store, not an error injected in the code.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use super::TempDir;

/// A mounted tmpfs, unmounted and removed on drop.
pub struct Volume {
    dir: TempDir,
    filler: PathBuf,
}

impl Volume {
    /// Mounts a tmpfs of `size` (e.g. `8m`); `None` when this process may not mount (not
    /// root), so the caller can say it did not run.
    pub fn mount(size: &str) -> Option<Self> {
        let dir = TempDir::new("volume");
        let mounted = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=1777"),
                "tmpfs",
            ])
            .arg(&dir.0)
            .output()
            .ok()?;
        if !mounted.status.success() {
            eprintln!(
                "cannot mount a tmpfs ({}): this test needs root",
                String::from_utf8_lossy(&mounted.stderr).trim()
            );
            return None;
        }
        let filler = dir.join("filler");
        Some(Volume { dir, filler })
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes a filler file until the volume has no byte left.
    pub fn fill(&self) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.filler)
            .unwrap();
        let block = vec![0u8; 64 * 1024];
        loop {
            if let Err(e) = file.write_all(&block) {
                assert_eq!(e.raw_os_error(), Some(28), "ENOSPC expected, got {e}");
                break;
            }
        }
        // Whatever is left, byte by byte sized writes.
        while file.write_all(&[0u8; 512]).is_ok() {}
        while file.write_all(&[0u8]).is_ok() {}
        let _ = file.sync_all();
    }

    /// Frees the space the filler took.
    pub fn free(&self) {
        let _ = std::fs::remove_file(&self.filler);
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir.0).output();
    }
}
