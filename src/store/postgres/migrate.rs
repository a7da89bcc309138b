//! Schema migrations from `migrations/`, applied by `idemproxy migrate` (or `--migrate`).
//!
//! Ordinary migrations are applied in one transaction under an advisory lock, so several
//! replicas starting at once with `--migrate` apply each exactly once. An index on the key
//! table is built `CONCURRENTLY` instead, outside a transaction, so that a large table
//! keeps taking writes meanwhile; its version is recorded only once the index is valid,
//! and a build that died half way (an invalid index nobody is building) is started again.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::store::StoreError;

/// One migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
    /// `Some(index name)`: the statement builds that index `CONCURRENTLY` (no transaction).
    pub concurrent_index: Option<&'static str>,
}

const fn plain(version: i32, name: &'static str, sql: &'static str) -> Migration {
    Migration {
        version,
        name,
        sql,
        concurrent_index: None,
    }
}

/// The migrations in order.
pub const MIGRATIONS: &[Migration] = &[
    plain(
        1,
        "idempotency_keys",
        include_str!("../../../migrations/0001_idempotency_keys.sql"),
    ),
    plain(
        2,
        "reserve_reads_first",
        include_str!("../../../migrations/0002_reserve_reads_first.sql"),
    ),
    plain(
        3,
        "group_commit",
        include_str!("../../../migrations/0003_group_commit.sql"),
    ),
    plain(
        4,
        "reconcile",
        include_str!("../../../migrations/0004_reconcile.sql"),
    ),
    Migration {
        version: 5,
        name: "unresolved_index",
        sql: include_str!("../../../migrations/0005_unresolved_index.sql"),
        concurrent_index: Some("idempotency_keys_unresolved"),
    },
    plain(
        6,
        "derived_key",
        include_str!("../../../migrations/0006_derived_key.sql"),
    ),
    plain(
        7,
        "sealed_answers",
        include_str!("../../../migrations/0007_sealed_answers.sql"),
    ),
    plain(
        8,
        "key_form",
        include_str!("../../../migrations/0008_key_form.sql"),
    ),
    plain(
        9,
        "set_based_batch",
        include_str!("../../../migrations/0009_set_based_batch.sql"),
    ),
    Migration {
        version: 10,
        name: "byte_order_key_index",
        sql: include_str!("../../../migrations/0010_byte_order_key_index.sql"),
        concurrent_index: Some("idempotency_keys_key_c"),
    },
    plain(
        11,
        "byte_order_keys",
        include_str!("../../../migrations/0011_byte_order_keys.sql"),
    ),
    plain(
        12,
        "probe_answer",
        include_str!("../../../migrations/0012_probe_answer.sql"),
    ),
    plain(
        13,
        "citus",
        include_str!("../../../migrations/0013_citus.sql"),
    ),
];

/// The schema version this binary needs: the last migration's.
pub const LATEST: i32 = MIGRATIONS[MIGRATIONS.len() - 1].version;

/// An arbitrary constant shared by every idemproxy process ("idem" in ASCII).
const MIGRATION_LOCK: i64 = 0x6964_656d;

/// How often a migrator waiting for another's index build looks again.
const BUILD_POLL: Duration = Duration::from_millis(200);

/// Applies every migration not yet applied; returns the versions it applied.
///
/// Unbounded on the server: the pool's connections carry `statement_timeout` equal to the
/// store timeout (seconds), and an index build or the copy of a table's keys to Citus
/// workers takes as long as the table is large. The session's bound is lifted for the
/// migrations and restored after (`RESET` goes back to the connection's start-up value);
/// a connection without one (a transaction pooler's, where a session `SET` would stay on
/// a server connection another client gets next) is left alone.
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>, StoreError> {
    let bounded = client
        .simple_query("SHOW statement_timeout")
        .await?
        .iter()
        .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) != Some("0")));
    if bounded {
        client.batch_execute("SET statement_timeout = 0").await?;
    }
    let result = migrate_all(client).await;
    if bounded {
        let reset = client.batch_execute("RESET statement_timeout").await;
        if result.is_ok() {
            reset?;
        }
    }
    result
}

async fn migrate_all(client: &mut Client) -> Result<Vec<i32>, StoreError> {
    let mut applied = Vec::new();
    // In order: ordinary migrations up to the next index build in one transaction, then
    // the build, and so on.
    let mut rest = MIGRATIONS;
    while !rest.is_empty() {
        let plain = rest
            .iter()
            .position(|m| m.concurrent_index.is_some())
            .unwrap_or(rest.len());
        let (now, later) = rest.split_at(plain);
        applied.extend(apply_in_transaction(client, now).await?);
        if let Some((index, after)) = later.split_first() {
            if build_index(client, index).await? {
                applied.push(index.version);
            }
            rest = after;
        } else {
            rest = later;
        }
    }
    super::distribute::distribute(client, MIGRATION_LOCK).await?;
    Ok(applied)
}

/// Applies those of `migrations` not yet applied, in one transaction.
async fn apply_in_transaction(
    client: &mut Client,
    migrations: &[Migration],
) -> Result<Vec<i32>, StoreError> {
    // Simple or unnamed typed statements only: a named prepared statement would be left on
    // a pooler's server connection (and collide with another client's of the same name).
    let tx = client.transaction().await?;
    tx.batch_execute(&format!("SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
        .await?;
    if super::distribute::has_citus(&tx).await? {
        // On a distributed table an ALTER runs on every shard at once, over several
        // connections per worker, after which Citus refuses, in the same transaction, a
        // statement it must run over one (a function it propagates). One connection per
        // worker throughout lets every migration share the transaction.
        tx.batch_execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
            .await?;
    }
    create_version_table(&tx).await?;
    let done = applied_versions(&tx).await?;
    let mut applied = Vec::new();
    for m in migrations {
        if done.contains(&m.version) {
            continue;
        }
        tx.batch_execute(m.sql).await?;
        record(&tx, m).await?;
        applied.push(m.version);
    }
    tx.commit().await?;
    Ok(applied)
}

/// Builds one index `CONCURRENTLY` unless recorded; whether this call recorded it. Safe
/// from several migrators at once without a session lock (which a transaction pooler
/// would leave behind on a server connection): each looks at the index's state and either
/// builds it, waits for the build in progress, or drops an invalid one nobody builds.
async fn build_index(client: &mut Client, m: &Migration) -> Result<bool, StoreError> {
    let Some(name) = m.concurrent_index else {
        return Ok(false);
    };
    create_version_table(client).await?;
    // A build racing another's can fail on the catalog ("tuple concurrently updated"):
    // such a step is tried again after a pause, for a bounded number of times.
    let mut failures = 0;
    // An invalid index is dropped only when it looked invalid on two looks in a row: a
    // build that has just created its entry is not reporting progress yet.
    let mut invalid_before = false;
    loop {
        let step = build_step(client, m, name, &mut invalid_before).await;
        match step {
            Ok(Some(recorded)) => return Ok(recorded),
            Ok(None) => {}
            Err(e) if failures >= MAX_BUILD_FAILURES => return Err(e),
            Err(e) => {
                failures += 1;
                tracing::warn!(cause = %e, index = name, "building the index raced another migrator; looking again");
                tokio::time::sleep(BUILD_POLL).await;
            }
        }
    }
}

/// Index build steps that may fail because another migrator is at work before giving up.
const MAX_BUILD_FAILURES: u32 = 20;

/// One look at the index and what it calls for: `Some(recorded)` when done.
async fn build_step(
    client: &mut Client,
    m: &Migration,
    name: &str,
    invalid_before: &mut bool,
) -> Result<Option<bool>, StoreError> {
    if applied_versions(client).await?.contains(&m.version) {
        return Ok(Some(false));
    }
    let state = index_state(client, name).await?;
    let invalid = state == IndexState::Invalid;
    match state {
        IndexState::Valid => return Ok(Some(record(client, m).await? > 0)),
        IndexState::Building => tokio::time::sleep(BUILD_POLL).await,
        IndexState::Invalid if !*invalid_before => tokio::time::sleep(BUILD_POLL).await,
        IndexState::Invalid => {
            client
                .batch_execute(&format!("DROP INDEX CONCURRENTLY IF EXISTS {name}"))
                .await?;
        }
        IndexState::Missing => client.batch_execute(m.sql).await?,
    }
    *invalid_before = invalid;
    Ok(None)
}

#[derive(Debug, PartialEq, Eq)]
enum IndexState {
    Missing,
    /// Present, not valid yet, and a `CREATE INDEX` is working on it.
    Building,
    /// Present, not valid, nobody building it: what a failed concurrent build leaves.
    Invalid,
    Valid,
}

async fn index_state(client: &Client, name: &str) -> Result<IndexState, StoreError> {
    let rows = client
        .query_typed(
            "SELECT i.indisvalid, EXISTS ( \
               SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = i.indexrelid) \
             FROM pg_index i WHERE i.indexrelid = to_regclass($1)",
            &[(&name, Type::TEXT)],
        )
        .await?;
    Ok(match rows.first() {
        None => IndexState::Missing,
        Some(row) if row.try_get::<_, bool>(0)? => IndexState::Valid,
        Some(row) if row.try_get::<_, bool>(1)? => IndexState::Building,
        Some(_) => IndexState::Invalid,
    })
}

async fn create_version_table(
    client: &impl tokio_postgres::GenericClient,
) -> Result<(), StoreError> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS idemproxy_migrations (
                 version    integer PRIMARY KEY,
                 name       text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
        )
        .await?;
    Ok(())
}

async fn applied_versions(
    client: &impl tokio_postgres::GenericClient,
) -> Result<Vec<i32>, StoreError> {
    Ok(client
        .query_typed("SELECT version FROM idemproxy_migrations", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect())
}

/// Records a migration as applied; how many rows that added (0: someone else did).
async fn record(
    client: &impl tokio_postgres::GenericClient,
    m: &Migration,
) -> Result<u64, StoreError> {
    Ok(client
        .execute_typed(
            "INSERT INTO idemproxy_migrations (version, name) VALUES ($1, $2) \
             ON CONFLICT (version) DO NOTHING",
            &[(&m.version, Type::INT4), (&m.name, Type::TEXT)],
        )
        .await?)
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
