-- The least a batch can cost: the same 15 completions and 15 new keys written by one
-- statement with constants, no per-write arrays, no checks for keys that have a row and
-- no answer per write — a floor, not something the proxy could send as it is.
\set p random(1, 1000000000000)
WITH c AS (
  UPDATE idempotency_keys k
     SET status = 'done', locked_until = NULL, completed_at = now(),
         expires_at = now() + interval '1 day', response_status = 201,
         response_headers = convert_to('content-type: application/json', 'UTF8'),
         response_body = '{"id":"pay_0123456789abcdef","status":"succeeded","amount":100,"currency":"RUB","recipient":"shop","purpose":"order"}'::bytea,
         replayable = true
    FROM unnest(string_to_array(:prevkeys, ','), string_to_array(:prevtoks, ',')::bigint[]) AS u(key, token)
   WHERE k.client_id = 'bench' AND k.key = u.key AND k.lease_token = u.token AND k.status <> 'done'
  RETURNING u.key
), ins AS (
  INSERT INTO idempotency_keys AS k (client_id, key, route, fingerprint, lease_token, locked_until, expires_at)
  SELECT 'bench', 'k' || :p || '-' || g, 'create-payment', '\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef'::bytea,
         nextval('idempotency_lease_token_seq'), now() + interval '30 s', now() + interval '1 day'
    FROM generate_series(1, 15) g
  ON CONFLICT (client_id, key) DO NOTHING
  RETURNING k.key, k.lease_token
)
SELECT (SELECT count(*) FROM c) AS done, array_to_string(array_agg(key ORDER BY key), ',') AS prevkeys, array_to_string(array_agg(lease_token ORDER BY key), ',') AS prevtoks FROM ins
\gset
