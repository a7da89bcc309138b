//! Schema migrations from `migrations/`, applied by `idemproxy migrate` (or `--migrate`).
//!
//! Applied in one transaction under an advisory lock, so several replicas starting at once
//! with `--migrate` apply each migration exactly once.

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use super::StoreError;

/// The migrations in order: (version, name, SQL).
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "idempotency_keys",
        include_str!("../../migrations/0001_idempotency_keys.sql"),
    ),
    (
        2,
        "reserve_reads_first",
        include_str!("../../migrations/0002_reserve_reads_first.sql"),
    ),
    (
        3,
        "group_commit",
        include_str!("../../migrations/0003_group_commit.sql"),
    ),
];

/// The schema version this binary needs: the last migration's.
pub const LATEST: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// An arbitrary constant shared by every idemproxy process ("idem" in ASCII).
const MIGRATION_LOCK: i64 = 0x6964_656d;

/// Applies every migration not yet applied; returns the versions it applied.
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>, StoreError> {
    // Simple or unnamed typed statements only: a named prepared statement would be left on
    // a pooler's server connection (and collide with another client's of the same name).
    let tx = client.transaction().await?;
    tx.batch_execute(&format!("SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS idemproxy_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    let done: Vec<i32> = tx
        .query_typed("SELECT version FROM idemproxy_migrations", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut applied = Vec::new();
    for (version, name, sql) in MIGRATIONS {
        if done.contains(version) {
            continue;
        }
        tx.batch_execute(sql).await?;
        tx.execute_typed(
            "INSERT INTO idemproxy_migrations (version, name) VALUES ($1, $2)",
            &[(version, Type::INT4), (name, Type::TEXT)],
        )
        .await?;
        applied.push(*version);
    }
    tx.commit().await?;
    Ok(applied)
}

impl super::PgStore {
    /// The schema version `idemproxy migrate` recorded; 0 where it never ran.
    pub async fn schema_version(&self) -> Result<i32, StoreError> {
        self.with_client(|client| async move {
            match client
                .simple_query("SELECT max(version) FROM idemproxy_migrations")
                .await
            {
                Ok(messages) => Ok(messages
                    .iter()
                    .find_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0),
                        _ => None,
                    })
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)),
                // No version table: never migrated.
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
                    Ok(0)
                }
                Err(e) => Err(e.into()),
            }
        })
        .await
    }
}
