//! The server settings the key table's churn needs, checked when the proxy starts.
//!
//! Why: every keyed request inserts a row and rewrites it on completion, so the table
//! leaves a dead row version per request and writes WAL at the request rate. A server
//! with autovacuum off, checkpoints spaced for a quieter database, or commits that are not
//! flushed serves the first minutes fine and then slows or loses acknowledged keys. None of
//! this is the proxy's to change; it says so in the start-up log instead, with the setting
//! to use (`docs/stores.md`, "Tuning the server", has the measurements behind each line).

use super::PgStore;
use crate::store::types::StoreError;

/// What the server runs with, as far as the key table is concerned.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    /// `autovacuum`.
    pub autovacuum: bool,
    /// `fsync`.
    pub fsync: bool,
    /// `synchronous_commit`.
    pub synchronous_commit: String,
    /// `max_wal_size`, in MiB.
    pub max_wal_size_mb: i64,
    /// The vacuum scale factor in force for the key table: its own storage parameter if
    /// it has one, else the server's `autovacuum_vacuum_scale_factor`.
    pub vacuum_scale_factor: f64,
}

/// `max_wal_size` below which a busy proxy's WAL forces checkpoints before their time
/// (measured: at ~3k keyed requests/s the table writes ~240 MB of WAL a minute, so 1 GB
/// is reached in about 4 minutes, under the default 5-minute `checkpoint_timeout`).
const MIN_WAL_SIZE_MB: i64 = 2048;
/// Scale factor above which autovacuum lets dead versions pile up between runs (the
/// default 0.2 waits for a fifth of a growing table; measured: minutes apart).
const MAX_VACUUM_SCALE_FACTOR: f64 = 0.05;

/// What to change, one sentence each, naming the setting; empty when nothing is far off.
pub fn advice(s: &ServerSettings) -> Vec<String> {
    let mut out = Vec::new();
    if !s.fsync {
        out.push(
            "PostgreSQL runs with fsync = off: a server crash can lose reservations the proxy has acknowledged, and a retry of one would execute again; set fsync = on".to_owned(),
        );
    }
    if s.synchronous_commit == "off" {
        out.push(
            "PostgreSQL runs with synchronous_commit = off: a server crash can lose the last reservations and stored answers the proxy relied on, and a retry of one would execute again; set synchronous_commit = on (the proxy's group commit already shares one flush among concurrent requests)".to_owned(),
        );
    }
    if !s.autovacuum {
        out.push(
            "PostgreSQL runs with autovacuum = off: every keyed request leaves a dead row version in idempotency_keys that nothing reclaims (measured: 1.8 M after 10 minutes at ~3k requests/s), so the table and its indexes grow until a manual VACUUM; set autovacuum = on (docs/stores.md, \"Tuning the server\")".to_owned(),
        );
    } else if s.vacuum_scale_factor > MAX_VACUUM_SCALE_FACTOR {
        out.push(format!(
            "autovacuum_vacuum_scale_factor is {} for idempotency_keys: autovacuum waits for that share of the table to be dead before it runs, and on a table that turns over at the request rate the runs come late and long; set it on the table to 0.01 or less: ALTER TABLE idempotency_keys SET (autovacuum_vacuum_scale_factor = 0.01) (docs/stores.md, \"Tuning the server\")",
            s.vacuum_scale_factor
        ));
    }
    if s.max_wal_size_mb < MIN_WAL_SIZE_MB {
        out.push(format!(
            "PostgreSQL's max_wal_size is {} MB: under sustained keyed load the WAL reaches it before checkpoint_timeout and forces checkpoints early (each one a burst of writes that lengthens the tail); set max_wal_size to at least {} MB (docs/stores.md, \"Tuning the server\")",
            s.max_wal_size_mb, MIN_WAL_SIZE_MB
        ));
    }
    out
}

/// The settings, as the store's own connection sees them.
const SETTINGS: &str = "SELECT current_setting('autovacuum') = 'on', \
     current_setting('fsync') = 'on', \
     current_setting('synchronous_commit'), \
     (SELECT setting::bigint FROM pg_settings WHERE name = 'max_wal_size'), \
     coalesce((SELECT option_value::float8 FROM pg_class c, pg_options_to_table(c.reloptions) \
               WHERE c.oid = to_regclass('idempotency_keys') \
                 AND option_name = 'autovacuum_vacuum_scale_factor'), \
              current_setting('autovacuum_vacuum_scale_factor')::float8)";

impl PgStore {
    /// Reads the server settings that matter for the key table.
    pub async fn server_settings(&self) -> Result<ServerSettings, StoreError> {
        self.with_client(|client| async move {
            let rows = client.typed_query(SETTINGS, &[]).await?;
            let row = rows
                .first()
                .ok_or_else(|| StoreError::Corrupt("no row of server settings".into()))?;
            Ok(ServerSettings {
                autovacuum: row.try_get(0)?,
                fsync: row.try_get(1)?,
                synchronous_commit: row.try_get(2)?,
                max_wal_size_mb: row.try_get(3)?,
                vacuum_scale_factor: row.try_get(4)?,
            })
        })
        .await
    }

    /// What to change on the server this store is connected to, one sentence per setting
    /// far off (for the start-up log; empty when nothing is).
    pub async fn server_advice(&self) -> Result<Vec<String>, StoreError> {
        Ok(advice(&self.server_settings().await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuned() -> ServerSettings {
        ServerSettings {
            autovacuum: true,
            fsync: true,
            synchronous_commit: "on".into(),
            max_wal_size_mb: 4096,
            vacuum_scale_factor: 0.01,
        }
    }

    #[test]
    fn a_tuned_server_gets_no_advice() {
        assert!(advice(&tuned()).is_empty());
        let local = ServerSettings {
            synchronous_commit: "remote_apply".into(),
            ..tuned()
        };
        assert!(advice(&local).is_empty());
    }

    #[test]
    fn each_setting_far_off_is_named() {
        let cases: [(ServerSettings, &str); 5] = [
            (
                ServerSettings {
                    autovacuum: false,
                    ..tuned()
                },
                "autovacuum = off",
            ),
            (
                ServerSettings {
                    fsync: false,
                    ..tuned()
                },
                "fsync = off",
            ),
            (
                ServerSettings {
                    synchronous_commit: "off".into(),
                    ..tuned()
                },
                "synchronous_commit = off",
            ),
            (
                ServerSettings {
                    max_wal_size_mb: 1024,
                    ..tuned()
                },
                "max_wal_size is 1024 MB",
            ),
            (
                ServerSettings {
                    vacuum_scale_factor: 0.2,
                    ..tuned()
                },
                "autovacuum_vacuum_scale_factor is 0.2",
            ),
        ];
        for (settings, named) in cases {
            let said = advice(&settings);
            assert_eq!(said.len(), 1, "{said:?}");
            assert!(said[0].contains(named), "{said:?} should name {named}");
        }
    }

    #[test]
    fn with_autovacuum_off_its_scale_factor_is_not_the_point() {
        let off = ServerSettings {
            autovacuum: false,
            vacuum_scale_factor: 0.2,
            ..tuned()
        };
        let said = advice(&off);
        assert_eq!(said.len(), 1);
        assert!(said[0].contains("autovacuum = off"));
    }
}
