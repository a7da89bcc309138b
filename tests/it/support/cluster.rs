//! Throwaway PostgreSQL clusters for tests that need what the shared server must never be
//! made to do: TLS only, a standby, a promotion, a stop. Each runs Debian's server binaries
//! (`pg_config --bindir`) on a free port, in a temporary directory, as the `postgres` OS
//! user when the tests run as root, and is stopped and removed on drop.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{TempDir, free_port};

/// Where the server binaries are.
fn bindir() -> PathBuf {
    let out = Command::new("pg_config").arg("--bindir").output();
    match out {
        Ok(out) if out.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        }
        _ => PathBuf::from("/usr/lib/postgresql/15/bin"),
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A server binary as the user that may run it (`postgres` when we are root).
fn server_command(tool: &str) -> Command {
    let path = bindir().join(tool);
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(path);
        c
    } else {
        Command::new(path)
    }
}

fn run(mut command: Command, what: &str) {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Gives `path` (recursively) to the server's user.
pub fn give_to_server(path: &Path) {
    if is_root() {
        run(
            {
                let mut c = Command::new("chown");
                c.args(["-R", "postgres:postgres"]).arg(path);
                c
            },
            "chown",
        );
    }
}

/// A running throwaway cluster.
pub struct Cluster {
    pub port: u16,
    pub data: PathBuf,
    /// Holds the data directory and the log; removed on drop, after the server stops.
    dir: TempDir,
}

impl Cluster {
    /// `initdb`, then `conf` appended to `postgresql.conf` and `hba` as the whole
    /// `pg_hba.conf` (a `local` trust line is always added, for `pg_ctl`), then started.
    pub fn start_new(name: &str, conf: &str, hba: &str) -> Self {
        let cluster = Self::init(name, conf, hba);
        cluster.start();
        cluster
    }

    /// Like `start_new`, without starting it; `prepare` may add files to the data
    /// directory first (certificates), before `start`.
    pub fn init(name: &str, conf: &str, hba: &str) -> Self {
        let dir = TempDir::new(&format!("cluster-{name}"));
        let data = dir.join("data");
        give_to_server(&dir.0);
        let mut initdb = server_command("initdb");
        initdb
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data);
        run(initdb, "initdb");
        let port = free_port();
        let cluster = Cluster { port, data, dir };
        cluster.configure(conf, hba);
        cluster
    }

    /// A streaming standby of `primary` (`pg_basebackup -R`), reporting itself as
    /// `application_name` (the name `synchronous_standby_names` lists), started.
    pub fn standby_of(primary: &Cluster, name: &str, application_name: &str) -> Self {
        let dir = TempDir::new(&format!("cluster-{name}"));
        give_to_server(&dir.0);
        let data = dir.join("data");
        let mut backup = server_command("pg_basebackup");
        backup
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-X", "stream", "-R", "--no-sync", "--checkpoint=fast", "-D"])
            .arg(&data);
        run(backup, "pg_basebackup");
        let port = free_port();
        let standby = Cluster { port, data, dir };
        let hba = std::fs::read_to_string(primary.data.join("pg_hba.conf")).unwrap();
        let hba = hba
            .lines()
            .filter(|l| !l.starts_with("local"))
            .collect::<Vec<_>>()
            .join("\n");
        standby.configure("", &format!("{hba}\n"));
        let auto = standby.data.join("postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&auto).unwrap();
        text.push_str(&format!(
            "\nprimary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name={application_name}'\nsynchronous_standby_names = ''\n",
            primary.port
        ));
        std::fs::write(&auto, text).unwrap();
        give_to_server(&standby.data);
        standby.start();
        standby
    }

    /// Promotes a standby to primary and waits until it takes writes.
    pub fn promote(&self) {
        run(
            self.pg_ctl(&["-w", "-t", "30", "promote"]),
            "pg_ctl promote",
        );
    }

    fn configure(&self, conf: &str, hba: &str) {
        let base = format!(
            "port = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nfsync = off\nmax_connections = 40\nshared_buffers = 16MB\n",
            self.port,
            self.dir.0.display()
        );
        let conf_path = self.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path).unwrap();
        text.push_str(&base);
        text.push_str(conf);
        std::fs::write(&conf_path, text).unwrap();
        std::fs::write(
            self.data.join("pg_hba.conf"),
            format!("local all all trust\nlocal replication all trust\n{hba}"),
        )
        .unwrap();
        give_to_server(&self.data);
    }

    fn pg_ctl(&self, args: &[&str]) -> Command {
        let mut c = server_command("pg_ctl");
        c.arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(args);
        c
    }

    /// Moves the WAL to `dir` (as `initdb --waldir` would), before `start`: for a test
    /// that fills the WAL's volume.
    pub fn move_wal_to(&self, dir: &Path) {
        let wal = self.data.join("pg_wal");
        let out = Command::new("sh")
            .arg("-c")
            .arg("cp -a \"$1\"/. \"$2\"/ && rm -rf \"$1\" && ln -s \"$2\" \"$1\"")
            .arg("sh")
            .arg(&wal)
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        give_to_server(dir);
        give_to_server(&self.data);
    }

    /// Stops the server at once if it runs; nothing said when it does not.
    pub fn stop_if_running(&self) {
        let _ = self.pg_ctl(&["-m", "immediate", "-w", "stop"]).output();
    }

    /// Runs SQL as `psql` does, whatever comes of it (the server may crash on it): what it
    /// printed, errors included.
    pub fn psql_unchecked(&self, db: &str, sql: &str) -> String {
        let out = self.psql_command(db, sql).output().unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// Starts the server and waits until it accepts connections.
    pub fn start(&self) {
        run(self.pg_ctl(&["-w", "-t", "30", "start"]), "pg_ctl start");
    }

    /// Stops the server at once, as a crash would (no checkpoint).
    pub fn stop_immediate(&self) {
        run(
            self.pg_ctl(&["-m", "immediate", "-w", "stop"]),
            "pg_ctl stop",
        );
    }

    /// A file in the data directory, owned by the server's user, mode `0600`.
    pub fn put_file(&self, name: &str, contents: &[u8]) {
        let path = self.data.join(name);
        std::fs::write(&path, contents).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        give_to_server(&path);
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// A URL for `user` on `db` over TCP to 127.0.0.1, with extra `params`.
    pub fn url(&self, user: &str, db: &str, params: &str) -> String {
        let sep = if params.is_empty() { "" } else { "?" };
        format!(
            "postgres://{user}@127.0.0.1:{}/{db}{sep}{params}",
            self.port
        )
    }

    /// Runs SQL as the superuser over the cluster's Unix socket (whatever `pg_hba.conf`
    /// says about TCP).
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let mut c = self.psql_command(db, sql);
        c.args(["-v", "ON_ERROR_STOP=1"]);
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `psql` on `db` over the cluster's Unix socket, running `sql`.
    fn psql_command(&self, db: &str, sql: &str) -> Command {
        let mut c = Command::new(bindir().join("psql"));
        c.args(["-X", "-q", "-At", "-h"]).arg(&self.dir.0).args([
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
            "-d",
            db,
            "-c",
            sql,
        ]);
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["-m", "immediate", "-w", "stop"]).output();
    }
}

/// A real PgBouncer in front of a cluster, run as the server's user (it refuses root),
/// daemonised with a pid file and stopped on drop.
pub struct PgBouncer {
    pub port: u16,
    dir: TempDir,
}

impl PgBouncer {
    /// `pool_mode = transaction` with `pool_size` server connections per database, so
    /// that server connections are shared between clients; `db` is served as itself.
    pub fn start(cluster: &Cluster, db: &str, pool_size: usize) -> Self {
        let dir = TempDir::new("pgbouncer");
        let port = free_port();
        let ini = format!(
            "[databases]\n{db} = host=127.0.0.1 port={} dbname={db} user=postgres\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = any\npool_mode = transaction\ndefault_pool_size = {pool_size}\nmin_pool_size = 0\nreserve_pool_size = 0\nmax_client_conn = 200\nlogfile = {log}\npidfile = {pid}\nadmin_users = postgres\n",
            cluster.port,
            log = dir.join("pgbouncer.log").display(),
            pid = dir.join("pgbouncer.pid").display(),
        );
        let config = dir.join("pgbouncer.ini");
        std::fs::write(&config, ini).unwrap();
        give_to_server(&dir.0);
        let binary = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("pgbouncer");
        let mut command = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", binary]);
            c
        } else {
            Command::new(binary)
        };
        command.arg("-d").arg(&config);
        run(command, "pgbouncer");
        let bouncer = PgBouncer { port, dir };
        let up = (0..100).any(|_| {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            false
        });
        assert!(up, "pgbouncer did not start: {}", bouncer.log());
        bouncer
    }

    /// The URL of `db` through the pooler.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pgbouncer.pid")) {
            let _ = Command::new("kill").arg("-TERM").arg(pid.trim()).status();
            // Let it exit before its directory goes.
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}
