-- The same batch, and the completions' and new keys' statements idempotency_batch() (0009)
-- runs for it, as one statement outside a function (data-modifying CTEs): what the
-- function's machinery costs. Left out: the release statement (this batch has none; the
-- function runs it anyway) and NOTIFY (nobody waits here).
\set p random(1, 1000000000000)
WITH a AS MATERIALIZED (SELECT
  array_fill('reserve'::text, ARRAY[15]) || array_fill('complete'::text, ARRAY[15]) AS op,
  array_fill('bench'::text, ARRAY[30]) AS client_id,
  array(SELECT 'k' || :p || '-' || g FROM generate_series(1, 15) g) || string_to_array(:prevkeys, ',') AS key,
  array_fill('\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef'::bytea, ARRAY[30]) AS fingerprint,
  array_fill('create-payment'::text, ARRAY[30]) AS route,
  array_fill(30000::bigint, ARRAY[30]) AS lease_ms,
  array_fill(86400000::bigint, ARRAY[30]) AS retention_ms,
  array_fill(NULL::bigint, ARRAY[15]) || string_to_array(:prevtoks, ',')::bigint[] AS token,
  array_fill(201::smallint, ARRAY[30]) AS status,
  array_fill(convert_to('content-type: application/json', 'UTF8'), ARRAY[30]) AS headers,
  array_fill('{"id":"pay_0123456789abcdef","status":"succeeded","amount":100,"currency":"RUB","recipient":"shop","purpose":"order"}'::bytea, ARRAY[30]) AS body,
  array_fill(true, ARRAY[30]) AS replayable,
  array_fill(NULL::text, ARRAY[30]) AS notify,
  array_fill(true, ARRAY[30]) AS takeover,
  array_fill(NULL::text, ARRAY[30]) AS derived_key,
  array_fill(NULL::text, ARRAY[30]) AS sealed_with),
c AS (
  UPDATE idempotency_keys k
     SET status = 'done', locked_until = NULL, completed_at = now(),
         expires_at = now() + c.retention_ms * interval '1 millisecond',
         response_status = c.status, response_headers = c.headers,
         response_body = c.body, replayable = c.replayable, sealed_with = c.sealed_with
    FROM a, unnest(a.op, a.client_id, a.key, a.token, a.retention_ms, a.status, a.headers, a.body, a.replayable, a.sealed_with, a.notify)
         WITH ORDINALITY AS c(op, client_id, key, token, retention_ms, status, headers, body, replayable, sealed_with, notify, i)
   WHERE c.op = 'complete' AND k.client_id = c.client_id AND k.key = c.key
     AND k.lease_token = c.token AND k.status <> 'done'
  RETURNING c.i, c.notify
), firsts AS (
  SELECT DISTINCT ON (u.client_id, u.key) u.*
    FROM a, unnest(a.op, a.client_id, a.key, a.fingerprint, a.route, a.lease_ms, a.retention_ms, a.derived_key)
         WITH ORDINALITY AS u(op, client_id, key, fingerprint, route, lease_ms, retention_ms, derived_key, i)
   WHERE u.op = 'reserve'
     AND NOT EXISTS (SELECT 1 FROM idempotency_keys e WHERE e.client_id = u.client_id AND e.key = u.key)
   ORDER BY u.client_id, u.key, u.i
), inserted AS (
  INSERT INTO idempotency_keys AS k (client_id, key, route, fingerprint, lease_token, locked_until, expires_at, derived_key)
  SELECT f.client_id, f.key, f.route, f.fingerprint, nextval('idempotency_lease_token_seq'),
         now() + f.lease_ms * interval '1 millisecond', now() + f.retention_ms * interval '1 millisecond', f.derived_key
    FROM firsts f ORDER BY f.client_id, f.key
  ON CONFLICT (client_id, key) DO NOTHING
  RETURNING k.client_id, k.key, k.lease_token, k.attempts, k.derived_key
), r AS (
  SELECT f.i, ins.key, ins.lease_token FROM inserted ins JOIN firsts f ON f.client_id = ins.client_id AND f.key = ins.key
)
SELECT (SELECT count(*) FROM c) AS done, array_to_string(array_agg(key ORDER BY key), ',') AS prevkeys,
       array_to_string(array_agg(lease_token ORDER BY key), ',') AS prevtoks FROM r
\gset
