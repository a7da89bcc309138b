-- The proxy's own statements for a new key, one request at a time: idempotency_reserve()
-- (src/store/postgres/sql.rs RESERVE), then the fenced completion (COMPLETE, without the
-- notification), each committed on its own. Not a baseline for the proxy — bench/run's
-- baselines are the seed's statements — but what a server (a Citus cluster, bench/citus.sh)
-- reaches for exactly what a keyed request asks of it.
\set r random(1, 1000000000000)
SELECT o_lease_token AS token
  FROM idempotency_reserve('pgbench-' || :client_id, 'k' || :r, '\x00', 'create-payment',
                           30000, 86400000, p_reads_sealed => true) \gset
WITH done AS (
  UPDATE idempotency_keys
     SET status = 'done', locked_until = NULL, completed_at = now(),
         expires_at = now() + 86400000::int8 * interval '1 millisecond',
         response_status = 201, response_headers = '\x', response_body = '\x7b7d',
         replayable = true
   WHERE client_id = 'pgbench-' || :client_id AND key = 'k' || :r
     AND lease_token = :token AND status = 'in_progress'
  RETURNING 1)
SELECT count(*) FROM done;
