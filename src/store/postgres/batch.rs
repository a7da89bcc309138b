//! PostgreSQL's side of group commit: a batch of writes is one call of
//! `idempotency_batch()` (`migrations/0003_group_commit.sql`), a lone write its own
//! statement, so that an idle proxy's requests cost what they did before batching.

use tokio_postgres::Row;
use tokio_postgres::types::Type;

use super::Param;
use super::PgStore;
use super::listen;
use super::sql::*;
use crate::store::types::*;
use crate::store::writes::{Write, WriteBatch, Written, on_this_runtime, row_order};

/// At most one warning this often for batches the server refuses.
const REFUSAL_WARNING_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

const BATCH: &str = "SELECT o_index, o_outcome, o_lease_token, o_attempts, o_lease_remaining_ms, \
     o_response_status, o_response_headers, o_response_body, o_replayable, o_expires_in_ms, \
     o_derived_key, o_sealed_with \
     FROM idempotency_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
     p_reads_sealed => true)";

impl WriteBatch for PgStore {
    async fn write_batch(&self, writes: Vec<Write>) -> Vec<Result<Written, StoreError>> {
        if let [write] = writes.as_slice() {
            return vec![self.write_one(write).await];
        }
        match self.distributed().await {
            Ok(true) => return self.write_each(writes).await,
            Ok(false) => {}
            Err(e) => {
                let shared = std::sync::Arc::new(e);
                return writes
                    .iter()
                    .map(|_| Err(StoreError::Shared(std::sync::Arc::clone(&shared))))
                    .collect();
            }
        }
        match self.batch_statement(&writes).await {
            Ok(results) => results,
            // The server could not take the batch: it could not take its members either.
            Err(e) if e.is_unreachable() || e.breaks_connections() => {
                let shared = std::sync::Arc::new(e);
                writes
                    .iter()
                    .map(|_| Err(StoreError::Shared(std::sync::Arc::clone(&shared))))
                    .collect()
            }
            // One member's statement failed and rolled the batch back (or the server
            // refused the batch's statement): nothing of it was written, so each member
            // runs alone and only the bad one fails. Worked around, but not normal: a
            // warning and a count, and the table's layout is looked up again (it may have
            // been distributed meanwhile).
            Err(e) => {
                self.refused_batch(&e, writes.len());
                let mut results = Vec::with_capacity(writes.len());
                for write in &writes {
                    results.push(self.write_one(write).await);
                }
                results
            }
        }
    }

    /// On the store's thread, beside their connections, when they have their own lane
    /// (see `store::postgres::lanes`).
    fn start_batches<F>(&self, task: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if self.lanes.batches_apart() {
            super::io_thread::spawn(task);
            return true;
        }
        on_this_runtime(task)
    }
}

impl PgStore {
    /// Counts a batch the server refused, and says why: a warning at most every
    /// [`REFUSAL_WARNING_EVERY`] (a full disk refuses every batch; the count says how
    /// many), otherwise at debug level. A refusal of what the statement is made of
    /// (`feature_not_supported`: Citus on a table distributed while this process ran)
    /// has the table's layout looked up again.
    fn refused_batch(&self, e: &StoreError, writes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        let n = self.batch_fallbacks.fetch_add(1, Relaxed) + 1;
        if let StoreError::Postgres(pg) = e
            && pg.code() == Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED)
        {
            self.layout.forget();
        }
        let now = crate::clock::now_ms().max(0) as u64;
        let last = self.batch_refusal_warned.load(Relaxed);
        let every = REFUSAL_WARNING_EVERY.as_millis() as u64;
        if (last == 0 || now.saturating_sub(last) >= every)
            && self
                .batch_refusal_warned
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            tracing::warn!(cause = %e, writes, refused_so_far = n, "the store refused a batch; its writes run one at a time (store_batch_fallbacks_total counts them)");
        } else {
            tracing::debug!(cause = %e, writes, "the store refused a batch; its writes run one at a time");
        }
    }

    /// A reservation, completion or release: through group commit on one PostgreSQL, in a
    /// statement of its own on a distributed table (see `distributed`).
    pub(super) async fn write(&self, write: Write) -> Result<Written, StoreError> {
        if self.distributed().await? {
            // Counted as a batch of one: on a distributed table each write is its own
            // commit, which is what the batch counters measure.
            self.group.count(1);
            return self.write_one(&write).await;
        }
        self.group.write(self, write).await
    }

    /// Runs a statement that only applies while the row carries the fence's token.
    /// `$1..$3` are the fence; `notify` adds `$4` (payload) and `$5` (whether to notify)
    /// and reads the affected count from the first column instead of the command tag.
    pub(super) async fn fenced(
        &self,
        sql: &str,
        fence: &Fence,
        notify: bool,
        extra: &[Param<'_>],
    ) -> Result<Fenced, StoreError> {
        let fenced_outcome = self
            .with_client(|client| async move {
                // Hashed only when someone may be waiting; otherwise the statement skips NOTIFY.
                let payload = if fence.notify {
                    crate::key::hex(&fence.key_id())
                } else {
                    String::new()
                };
                let mut params: Vec<Param<'_>> = vec![
                    (&fence.client_id, Type::TEXT),
                    (&fence.key, Type::TEXT),
                    (&fence.token, Type::INT8),
                ];
                if notify {
                    params.push((&payload, Type::TEXT));
                    params.push((&fence.notify, Type::BOOL));
                }
                params.extend_from_slice(extra);
                // The second column: a payload the statement returned for this process to
                // raise (a distributed table's form), or "" / NULL.
                let (n, raise) = if notify {
                    let rows = client.typed_query(sql, &params).await?;
                    let row = rows
                        .first()
                        .ok_or_else(|| StoreError::Corrupt("no row from a fenced write".into()))?;
                    let raise: Option<String> = row.try_get(1)?;
                    (
                        row.try_get::<_, i64>(0)? as u64,
                        raise.filter(|p| !p.is_empty()),
                    )
                } else {
                    (client.typed_execute(sql, &params).await?, None)
                };
                Ok((n, raise))
            })
            .await?;
        let (n, raise) = fenced_outcome;
        if let Some(payload) = raise {
            self.notify_from_here(listen::CHANNEL, &payload).await;
        }
        Ok(if n == 1 {
            Fenced::Applied
        } else {
            Fenced::Refused
        })
    }

    /// One write in a statement of its own.
    pub(super) async fn write_one(&self, write: &Write) -> Result<Written, StoreError> {
        match write {
            Write::Reserve(r) => {
                let req = r.request();
                self.with_client(|client| async move {
                    let fp: &[u8] = req.fingerprint;
                    let (lease, retention) = (millis(req.lease), millis(req.retention));
                    let rows = client
                        .typed_query(
                            RESERVE,
                            &[
                                (&req.client_id, Type::TEXT),
                                (&req.key, Type::TEXT),
                                (&fp, Type::BYTEA),
                                (&req.route, Type::TEXT),
                                (&lease, Type::INT8),
                                (&retention, Type::INT8),
                                (&req.takeover, Type::BOOL),
                                (&req.derived_key, Type::TEXT),
                            ],
                        )
                        .await?;
                    let row = rows.first().ok_or_else(|| {
                        StoreError::Corrupt("no row from idempotency_reserve".into())
                    })?;
                    reservation(row, 0).map(|(r, e)| Written::Reservation(r, e))
                })
                .await
            }
            Write::Complete(fence, completion) => {
                let (status, headers, body, replayable) = completion_columns(completion);
                let sealed_with = sealed_with(completion);
                let retention = millis(fence.retention);
                let distributed = self.distributed().await?;
                let sql = if distributed {
                    COMPLETE_DISTRIBUTED.as_str()
                } else {
                    COMPLETE
                };
                self.fenced(
                    sql,
                    fence,
                    true,
                    &[
                        (&status, Type::INT2),
                        (&headers, Type::BYTEA),
                        (&body, Type::BYTEA),
                        (&replayable, Type::BOOL),
                        (&retention, Type::INT8),
                        (&sealed_with, Type::TEXT),
                    ],
                )
                .await
                .map(Written::Fenced)
            }
            Write::Release(fence) => {
                let sql = if self.distributed().await? {
                    RELEASE_DISTRIBUTED.as_str()
                } else {
                    RELEASE
                };
                self.fenced(sql, fence, true, &[])
                    .await
                    .map(Written::Fenced)
            }
        }
    }

    /// Every write of `writes` in one statement, one transaction: the outer error when
    /// the statement failed (nothing was written), otherwise each write's own outcome.
    async fn batch_statement(
        &self,
        writes: &[Write],
    ) -> Result<Vec<Result<Written, StoreError>>, StoreError> {
        let order = row_order(writes);
        let n = writes.len();
        let mut op = Vec::with_capacity(n);
        let mut client_id = Vec::with_capacity(n);
        let mut key = Vec::with_capacity(n);
        let mut fingerprint: Vec<Option<&[u8]>> = Vec::with_capacity(n);
        let mut route: Vec<Option<&str>> = Vec::with_capacity(n);
        let mut lease: Vec<Option<i64>> = Vec::with_capacity(n);
        let mut retention: Vec<Option<i64>> = Vec::with_capacity(n);
        let mut token: Vec<Option<i64>> = Vec::with_capacity(n);
        let mut status: Vec<Option<i16>> = Vec::with_capacity(n);
        let mut headers: Vec<Option<&[u8]>> = Vec::with_capacity(n);
        let mut body: Vec<Option<&[u8]>> = Vec::with_capacity(n);
        let mut replayable: Vec<Option<bool>> = Vec::with_capacity(n);
        let mut notify: Vec<Option<String>> = Vec::with_capacity(n);
        let mut takeover: Vec<Option<bool>> = Vec::with_capacity(n);
        let mut derived: Vec<Option<&str>> = Vec::with_capacity(n);
        let mut sealed: Vec<Option<&str>> = Vec::with_capacity(n);
        for &i in &order {
            let (c, k) = writes[i].row();
            client_id.push(c);
            key.push(k);
            let (name, reserve, fence, completion) = match &writes[i] {
                Write::Reserve(r) => ("reserve", Some(r), None, None),
                Write::Complete(f, c) => ("complete", None, Some(f), Some(c)),
                Write::Release(f) => ("release", None, Some(f), None),
            };
            op.push(name);
            fingerprint.push(reserve.map(|r| r.fingerprint.as_slice()));
            route.push(reserve.map(|r| r.route.as_str()));
            lease.push(reserve.map(|r| millis(r.lease)));
            // A reservation's retention, or a completion's (counted from the completion).
            retention.push(
                reserve
                    .map(|r| r.retention)
                    .or(fence.filter(|_| completion.is_some()).map(|f| f.retention))
                    .map(millis),
            );
            token.push(fence.map(|f| f.token));
            takeover.push(reserve.map(|r| r.takeover));
            derived.push(reserve.and_then(|r| r.derived_key.as_deref()));
            // Hashed only when someone may be waiting; otherwise no NOTIFY is sent.
            notify.push(
                fence
                    .filter(|f| f.notify)
                    .map(|f| crate::key::hex(&f.key_id())),
            );
            let columns = completion.map(completion_columns);
            status.push(columns.map(|c| c.0));
            headers.push(columns.and_then(|c| c.1));
            body.push(columns.and_then(|c| c.2));
            replayable.push(columns.map(|c| c.3));
            sealed.push(completion.and_then(sealed_with));
        }
        let rows = self
            .with_client(|client| async move {
                Ok(client
                    .typed_query(
                        BATCH,
                        &[
                            (&op, Type::TEXT_ARRAY),
                            (&client_id, Type::TEXT_ARRAY),
                            (&key, Type::TEXT_ARRAY),
                            (&fingerprint, Type::BYTEA_ARRAY),
                            (&route, Type::TEXT_ARRAY),
                            (&lease, Type::INT8_ARRAY),
                            (&retention, Type::INT8_ARRAY),
                            (&token, Type::INT8_ARRAY),
                            (&status, Type::INT2_ARRAY),
                            (&headers, Type::BYTEA_ARRAY),
                            (&body, Type::BYTEA_ARRAY),
                            (&replayable, Type::BOOL_ARRAY),
                            (&notify, Type::TEXT_ARRAY),
                            (&takeover, Type::BOOL_ARRAY),
                            (&derived, Type::TEXT_ARRAY),
                            (&sealed, Type::TEXT_ARRAY),
                        ],
                    )
                    .await?)
            })
            .await?;
        let mut results: Vec<Option<Result<Written, StoreError>>> = (0..n).map(|_| None).collect();
        for row in &rows {
            let at = row
                .try_get::<_, i32>(0)
                .ok()
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| order.get(i.checked_sub(1)?).copied())
                .ok_or_else(|| StoreError::Corrupt("a batch answer with no write".into()))?;
            results[at] = Some(match &writes[at] {
                Write::Reserve(_) => reservation(row, 1).map(|(r, e)| Written::Reservation(r, e)),
                Write::Complete(..) | Write::Release(_) => fenced(row).map(Written::Fenced),
            });
        }
        Ok(results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(StoreError::Corrupt(
                        "no answer for a write in a batch".into(),
                    ))
                })
            })
            .collect())
    }
}

/// A completion's columns: status, headers, body, whether it replays.
fn completion_columns(c: &Completion) -> (i16, Option<&[u8]>, Option<&[u8]>, bool) {
    match c {
        Completion::Stored(r) => (
            r.status as i16,
            Some(r.headers.as_ref()),
            Some(r.body.as_ref()),
            true,
        ),
        Completion::NotReplayable { status } => (*status as i16, None, None, false),
    }
}

/// The ring key a completion's answer is sealed with, if it is.
fn sealed_with(c: &Completion) -> Option<&str> {
    match c {
        Completion::Stored(r) => r.sealed.as_ref().map(|s| s.ring_key.as_str()),
        Completion::NotReplayable { .. } => None,
    }
}

/// A completion's or release's answer in a batch.
fn fenced(row: &Row) -> Result<Fenced, StoreError> {
    match row.try_get::<_, &str>(1)? {
        "applied" => Ok(Fenced::Applied),
        "refused" => Ok(Fenced::Refused),
        other => Err(StoreError::Corrupt(format!("batch outcome `{other}`"))),
    }
}
