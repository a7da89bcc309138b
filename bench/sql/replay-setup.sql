-- 1,000 completed keys for replay.sql to read.
INSERT INTO idempotency_keys (client_id, key, route, fingerprint, status, lease_token, attempts,
                              response_status, response_headers, response_body, replayable, completed_at, expires_at)
SELECT 'pgbench-replay', 'k' || g, 'create-payment',
       '\x0101010101010101010101010101010101010101010101010101010101010101'::bytea, 'done', g, 1,
       201, '\x636f6e74656e742d747970653a206170706c69636174696f6e2f6a736f6e0d0a'::bytea,
       '\x7b226368617267655f6964223a312c22616d6f756e74223a3130307d'::bytea, true, now(), now() + interval '1 day'
FROM generate_series(0, 999) g
ON CONFLICT DO NOTHING;
