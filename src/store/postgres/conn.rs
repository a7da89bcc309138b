//! A pooled connection to PostgreSQL and how it runs statements: prepared once per direct
//! connection, or unnamed and typed inside `BEGIN; SET LOCAL statement_timeout …` behind a
//! transaction pooler (why: [`super::connect`]); and the mark that keeps a connection
//! whose call was given up on from being lent again.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, PoisonError};

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Statement};

/// A pooled connection.
pub struct PgConn {
    pub(super) client: Client,
    /// Raised when a call on this connection was given up (its statement may still be
    /// running, or the server stopped answering): it is not lent again.
    spoiled: Arc<AtomicBool>,
    /// Behind a pooler: the `BEGIN; SET LOCAL …` each statement runs after.
    begin: Option<Arc<str>>,
    /// Direct connections only: statements prepared on this connection, by their SQL, so
    /// that each is parsed and planned once per connection rather than on every call.
    /// (Behind a pooler a named statement would live on some other server connection.)
    prepared: std::sync::Mutex<HashMap<String, Statement>>,
}

impl PgConn {
    /// A new connection; `begin` when it goes through a transaction pooler.
    pub(super) fn new(client: Client, begin: Option<Arc<str>>) -> Self {
        PgConn {
            client,
            spoiled: Arc::default(),
            begin,
            prepared: std::sync::Mutex::default(),
        }
    }

    /// Runs an unnamed typed statement (bounded on the server, see the module doc).
    pub async fn typed_query(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let Some(begin) = &self.begin else {
            let statement = self.prepare(sql, params).await?;
            let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
            return self.client.query(&statement, &values).await;
        };
        self.query_in_transaction(begin, sql, params).await
    }

    /// `begin` (`BEGIN; SET LOCAL …`), an unnamed typed `sql`, `COMMIT`: queued in this
    /// order and sent back to back, one round trip.
    async fn query_in_transaction(
        &self,
        begin: &str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let (began, rows, committed) = tokio::join!(
            self.client.batch_execute(begin),
            self.client.query_typed(sql, params),
            self.client.batch_execute("COMMIT"),
        );
        began?;
        let rows = rows?;
        committed?;
        Ok(rows)
    }

    /// Runs `sql` with the planner held to plain index scans (`SET LOCAL
    /// enable_bitmapscan = off`), for the maintenance queries that read the keys in
    /// progress by lease end. Every completion leaves its key's old version in that index
    /// until vacuum reaches the table, and `locked_until < now()` matches all of them: a
    /// plain index scan marks each entry of a dead version once (LP_DEAD) and later scans
    /// skip it, where a bitmap scan never marks one and visits every completed key's heap
    /// page again on every run — a cost that grows with the completion rate until
    /// autovacuum runs (bench/RESULTS.md, issue 57). Unnamed and planned each time: it runs
    /// every few seconds at most.
    pub async fn index_walk_query(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let begin = format!(
            "{}; SET LOCAL enable_bitmapscan = off",
            self.begin.as_deref().unwrap_or("BEGIN")
        );
        self.query_in_transaction(&begin, sql, params).await
    }

    /// The statement for `sql` on this connection, prepared on first use.
    async fn prepare(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Statement, tokio_postgres::Error> {
        let cached = self
            .prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(sql)
            .cloned();
        if let Some(statement) = cached {
            return Ok(statement);
        }
        let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
        let statement = self.client.prepare_typed(sql, &types).await?;
        self.prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    /// Like [`PgConn::typed_query`], for the count of rows a statement touched.
    pub async fn typed_execute(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<u64, tokio_postgres::Error> {
        let Some(begin) = &self.begin else {
            let statement = self.prepare(sql, params).await?;
            let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
            return self.client.execute(&statement, &values).await;
        };
        let (began, count, committed) = tokio::join!(
            self.client.batch_execute(begin),
            self.client.execute_typed(sql, params),
            self.client.batch_execute("COMMIT"),
        );
        began?;
        let count = count?;
        committed?;
        Ok(count)
    }

    /// Whether a call on this connection was given up (see [`PgConn::spoiler`]).
    pub(super) fn is_spoiled(&self) -> bool {
        self.spoiled.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A handle that marks this connection unfit for reuse.
    pub fn spoiler(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.spoiled)
    }
}

impl std::ops::Deref for PgConn {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl std::ops::DerefMut for PgConn {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.client
    }
}
