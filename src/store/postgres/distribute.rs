//! How `idemproxy migrate` lays the schema out on a Citus coordinator, after the
//! migrations (Citus refuses some of them on a distributed table: 0011 changes
//! `client_id`'s collation). Idempotent: every step looks first, so each migrate run
//! completes what an earlier one (or an operator by hand) left half done.
//!
//! - The key table is distributed by `client_id`: every statement of a request names one
//!   `client_id`, so each runs on the worker holding that key's shard. An empty table is
//!   distributed in the migrations' lock; one that holds keys with
//!   `create_distributed_table_concurrently`, which keeps taking writes while it copies
//!   them (it uses logical replication, and cannot run in a transaction).
//! - `idempotency_reserve()` is delegated to the worker holding the key's shard
//!   (`create_distributed_function`, by `p_client_id`): a reservation is then one hop from
//!   the coordinator instead of one per statement inside it.
//! - Lease tokens: the delegated function takes them from the worker's copy of the
//!   sequence. Citus makes such copies for a sequence a distributed table's column
//!   defaults to, each node's in a range of its own (its group id in the top 16 bits), so
//!   `lease_token` defaults to it here. A token then never repeats for a row, also after
//!   its shard moves to another node: no two nodes' ranges meet.
//! - Everything else stays on the coordinator, the one node the proxies talk to:
//!   `idemproxy_migrations`, `idemproxy_settings`.
//!
//! Nothing happens on a plain PostgreSQL or on a Citus worker.

use tokio_postgres::Client;

use crate::store::StoreError;

const RESERVE_SIGNATURE: &str =
    "idempotency_reserve(text, text, bytea, text, bigint, bigint, boolean, text, boolean)";

/// See the module doc; `lock` is the migrations' advisory lock, taken around each step.
pub(super) async fn distribute(client: &mut Client, lock: i64) -> Result<(), StoreError> {
    if !has_citus(client).await? {
        return Ok(());
    }
    let tx = client.transaction().await?;
    tx.batch_execute(&format!("SELECT pg_advisory_xact_lock({lock})"))
        .await?;
    let row = tx
        .query_one(
            "SELECT citus_is_coordinator(), \
                    EXISTS (SELECT 1 FROM pg_dist_partition \
                            WHERE logicalrelid = to_regclass('idempotency_keys')), \
                    EXISTS (SELECT 1 FROM idempotency_keys)",
            &[],
        )
        .await?;
    let (coordinator, distributed, keys): (bool, bool, bool) =
        (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
    if !coordinator {
        return Ok(());
    }
    if !distributed && !keys {
        tx.batch_execute("SELECT create_distributed_table('idempotency_keys', 'client_id')")
            .await?;
        tracing::info!("distributed the key table by client_id (Citus)");
    }
    tx.commit().await?;
    if !distributed && keys {
        distribute_concurrently(client).await?;
    }
    delegate_reservations(client, lock).await
}

async fn distribute_concurrently(client: &mut Client) -> Result<(), StoreError> {
    tracing::info!(
        "distributing the key table by client_id (Citus); its keys are copied while it takes writes"
    );
    match client
        .batch_execute(
            "SELECT create_distributed_table_concurrently('idempotency_keys', 'client_id')",
        )
        .await
    {
        Ok(()) => Ok(()),
        // Another migrator distributed it meanwhile.
        Err(e)
            if e.as_db_error()
                .is_some_and(|d| d.message().contains("already distributed")) =>
        {
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The token sequence on every node, and `idempotency_reserve()` delegated (module doc).
async fn delegate_reservations(client: &mut Client, lock: i64) -> Result<(), StoreError> {
    let tx = client.transaction().await?;
    // One connection per worker: after the ALTER, Citus refuses to propagate a function
    // in the same transaction otherwise (see `migrate::apply_in_transaction`).
    tx.batch_execute(&format!(
        "SELECT pg_advisory_xact_lock({lock}); \
         SET LOCAL citus.multi_shard_modify_mode TO 'sequential'"
    ))
    .await?;
    let row = tx
        .query_one(
            &format!(
                "SELECT (SELECT column_default FROM information_schema.columns \
                         WHERE table_schema = current_schema() \
                           AND table_name = 'idempotency_keys' AND column_name = 'lease_token'), \
                        EXISTS (SELECT 1 FROM pg_dist_object \
                                WHERE objid = to_regprocedure('{RESERVE_SIGNATURE}') \
                                  AND distribution_argument_index IS NOT NULL), \
                        (SELECT proconfig IS NOT NULL FROM pg_proc \
                         WHERE oid = to_regprocedure('{RESERVE_SIGNATURE}')), \
                        quote_ident(current_schema())"
            ),
            &[],
        )
        .await?;
    let (default, delegated, pinned, schema): (Option<String>, bool, Option<bool>, String) = (
        row.try_get(0)?,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
    );
    if default.is_none() {
        tx.batch_execute(
            "ALTER TABLE idempotency_keys \
             ALTER COLUMN lease_token SET DEFAULT nextval('idempotency_lease_token_seq')",
        )
        .await?;
    }
    // On the worker the function runs under that connection's search_path, not the
    // caller's: it names the key table unqualified, so it is pinned to its own schema (a
    // migration that replaces the function drops the setting; the next run puts it back).
    if pinned != Some(true) {
        tx.batch_execute(&format!(
            "ALTER FUNCTION {RESERVE_SIGNATURE} SET search_path = {schema}"
        ))
        .await?;
    }
    if !delegated {
        tx.batch_execute(&format!(
            "SELECT create_distributed_function('{RESERVE_SIGNATURE}', 'p_client_id', \
             colocate_with := 'idempotency_keys')"
        ))
        .await?;
        tracing::info!("reservations run on the worker holding their key (Citus)");
    }
    tx.commit().await?;
    Ok(())
}

/// Whether the database has the Citus extension (one row, one boolean).
pub(super) const HAS_CITUS: &str =
    "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')";

/// Whether the database has the Citus extension.
pub(super) async fn has_citus(
    client: &impl tokio_postgres::GenericClient,
) -> Result<bool, StoreError> {
    let rows = client.query_typed(HAS_CITUS, &[]).await?;
    Ok(rows.first().is_some_and(|row| row.get::<_, bool>(0)))
}
