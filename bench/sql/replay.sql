-- The one statement idemproxy issues to replay a completed key.
\set r random(0, 999)
SELECT * FROM idempotency_reserve('pgbench-replay', 'k' || :r, '\x0101010101010101010101010101010101010101010101010101010101010101'::bytea, 'create-payment', 10000, 86400000);
