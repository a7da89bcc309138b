//! The PostgreSQL store: one table shared by any number of proxy replicas.
//!
//! Each call takes a connection from the pool, runs one prepared statement (one round trip)
//! and is bounded by the configured store timeout, so a database that hangs is treated like
//! one that is down instead of stalling requests.

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime, Timeouts};
use tokio_postgres::NoTls;

use super::types::*;
use crate::config::PostgresConfig;

const RESERVE: &str = "SELECT o_outcome, o_lease_token, o_attempts, o_lease_remaining_ms, \
     o_response_status, o_response_headers, o_response_body, o_replayable \
     FROM idempotency_reserve($1, $2, $3, $4, $5, $6)";

const RENEW: &str = "UPDATE idempotency_keys \
     SET locked_until = now() + $4 * interval '1 millisecond' \
     WHERE client_id = $1 AND key = $2 AND lease_token = $3 AND status = 'in_progress'";

const COMPLETE: &str = "UPDATE idempotency_keys \
     SET status = 'done', locked_until = NULL, completed_at = now(), \
         response_status = $4, response_headers = $5, response_body = $6, replayable = $7 \
     WHERE client_id = $1 AND key = $2 AND lease_token = $3 AND status = 'in_progress'";

const RELEASE: &str = "DELETE FROM idempotency_keys \
     WHERE client_id = $1 AND key = $2 AND lease_token = $3 AND status = 'in_progress'";

/// PostgreSQL-backed [`KeyStore`].
#[derive(Clone)]
pub struct PgStore {
    /// Connections are checked out per call; the pool bounds concurrency towards the database.
    pool: Pool,
    /// Bound on one call (pool wait included).
    timeout: Duration,
}

impl PgStore {
    /// Builds the pool; no connection is made until the first call.
    pub fn new(config: &PostgresConfig) -> Result<Self, StoreError> {
        let mut pg: tokio_postgres::Config =
            config.url.parse().map_err(|e: tokio_postgres::Error| {
                StoreError::Corrupt(format!("database URL: {e}"))
            })?;
        pg.connect_timeout(config.connect_timeout);
        if pg.get_application_name().is_none() {
            pg.application_name("idemproxy");
        }
        let manager = Manager::from_config(
            pg,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .runtime(Runtime::Tokio1)
            .timeouts(Timeouts {
                wait: Some(config.timeout),
                create: Some(config.connect_timeout),
                recycle: Some(config.timeout),
            })
            .build()
            .map_err(|e| StoreError::Corrupt(format!("pool: {e}")))?;
        Ok(Self {
            pool,
            timeout: config.timeout,
        })
    }

    /// The pool, for migrations and gauges.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    async fn bounded<T>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
    }

    async fn fenced(
        &self,
        sql: &str,
        fence: &Fence,
        extra: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Fenced, StoreError> {
        self.bounded(async {
            let client = self.pool.get().await?;
            let stmt = client.prepare_cached(sql).await?;
            let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                vec![&fence.client_id, &fence.key, &fence.token];
            params.extend_from_slice(extra);
            let n = client.execute(&stmt, &params).await?;
            Ok(if n == 1 {
                Fenced::Applied
            } else {
                Fenced::Refused
            })
        })
        .await
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl KeyStore for PgStore {
    async fn reserve(&self, req: &ReserveRequest<'_>) -> Result<Reservation, StoreError> {
        self.bounded(async {
            let client = self.pool.get().await?;
            let stmt = client.prepare_cached(RESERVE).await?;
            let fp: &[u8] = req.fingerprint;
            let row = client
                .query_one(
                    &stmt,
                    &[
                        &req.client_id,
                        &req.key,
                        &fp,
                        &req.route,
                        &millis(req.lease),
                        &millis(req.retention),
                    ],
                )
                .await?;
            let outcome: &str = row.try_get(0)?;
            let reservation = match outcome {
                "reserved" | "taken_over" => Reservation::Reserved(Lease {
                    token: row.try_get(1)?,
                    attempts: row.try_get(2)?,
                    takeover: outcome == "taken_over",
                }),
                "in_progress" => {
                    let ms: i64 = row.try_get(3)?;
                    Reservation::InProgress {
                        lease_remaining: Duration::from_millis(ms.max(0) as u64),
                    }
                }
                "mismatch" => Reservation::Mismatch,
                "done" => {
                    let status: i16 = row.try_get(4)?;
                    let status = u16::try_from(status)
                        .map_err(|_| StoreError::Corrupt(format!("status {status}")))?;
                    if row.try_get::<_, Option<bool>>(7)? == Some(false) {
                        Reservation::NotReplayable { status }
                    } else {
                        let headers: Option<Vec<u8>> = row.try_get(5)?;
                        let body: Option<Vec<u8>> = row.try_get(6)?;
                        Reservation::Done(StoredResponse {
                            status,
                            headers: headers.unwrap_or_default().into(),
                            body: body.unwrap_or_default().into(),
                        })
                    }
                }
                other => return Err(StoreError::Corrupt(format!("reserve outcome `{other}`"))),
            };
            Ok(reservation)
        })
        .await
    }

    async fn renew(&self, fence: &Fence, lease: Duration) -> Result<Fenced, StoreError> {
        self.fenced(RENEW, fence, &[&millis(lease)]).await
    }

    async fn complete(&self, fence: &Fence, completion: &Completion) -> Result<Fenced, StoreError> {
        let (status, headers, body, replayable): (i16, Option<&[u8]>, Option<&[u8]>, bool) =
            match completion {
                Completion::Stored(r) => (
                    r.status as i16,
                    Some(r.headers.as_ref()),
                    Some(r.body.as_ref()),
                    true,
                ),
                Completion::NotReplayable { status } => (*status as i16, None, None, false),
            };
        self.fenced(COMPLETE, fence, &[&status, &headers, &body, &replayable])
            .await
    }

    async fn release(&self, fence: &Fence) -> Result<Fenced, StoreError> {
        self.fenced(RELEASE, fence, &[]).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.bounded(async {
            let client = self.pool.get().await?;
            client.simple_query("SELECT 1").await?;
            Ok(())
        })
        .await
    }
}
