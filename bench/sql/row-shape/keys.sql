-- keys: idemproxy's key table as `idemproxy migrate` leaves it, a new key's row written
-- as idempotency_reserve() inserts it, then completed as the COMPLETE statement does
-- (status, lease end and expiry change: the row's new version is not HOT).
\set r random(1, 1000000000000)
INSERT INTO idempotency_keys (client_id, key, route, fingerprint, lease_token, locked_until, expires_at)
VALUES ('pgbench-' || :client_id, 'k' || :r, 'payments', '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea,
        nextval('idempotency_lease_token_seq'), now() + interval '30 seconds', now() + interval '24 hours')
ON CONFLICT (client_id, key) DO NOTHING;
UPDATE idempotency_keys
   SET status = 'done', locked_until = NULL, completed_at = now(), expires_at = now() + interval '24 hours',
       response_status = 201, response_headers = '\x636f6e74656e742d747970653a206170706c69636174696f6e2f6a736f6e0d0a'::bytea,
       response_body = '\x7b22636861726765223a317d'::bytea, replayable = true
 WHERE client_id = 'pgbench-' || :client_id AND key = 'k' || :r AND status = 'in_progress';
