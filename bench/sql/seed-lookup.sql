-- The seed article's lookup of a key that is taken: what a replay needs.
\set r random(0, 999)
select status, status_code, response, fingerprint from idempotency
where client_id = 'pgbench-replay' and key = 'k' || :r;
