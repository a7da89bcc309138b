-- One group-commit batch as the proxy sends it under keyed load: 15 new keys reserved and
-- the 15 this client reserved one batch before completed, through idempotency_batch().
-- pgbench keeps the reserved keys and tokens for the next batch (\gset); bench/batch-shape.
\set p random(1, 1000000000000)
WITH n AS MATERIALIZED (SELECT array(SELECT 'k' || :p || '-' || g FROM generate_series(1, 15) g) AS keys)
SELECT array_to_string(array_agg(k ORDER BY k), ',') AS prevkeys, array_to_string(array_agg(t ORDER BY k), ',') AS prevtoks FROM (
SELECT n.keys[b.o_index] AS k, b.o_lease_token AS t
FROM n, idempotency_batch(
  array_fill('reserve'::text, ARRAY[15]) || array_fill('complete'::text, ARRAY[15]),
  array_fill('bench'::text, ARRAY[30]),
  n.keys || string_to_array(:prevkeys, ','),
  array_fill('\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef'::bytea, ARRAY[30]),
  array_fill('create-payment'::text, ARRAY[30]),
  array_fill(30000::bigint, ARRAY[30]),
  array_fill(86400000::bigint, ARRAY[30]),
  array_fill(NULL::bigint, ARRAY[15]) || string_to_array(:prevtoks, ',')::bigint[],
  array_fill(201::smallint, ARRAY[30]),
  array_fill(convert_to('content-type: application/json', 'UTF8'), ARRAY[30]),
  array_fill('{"id":"pay_0123456789abcdef","status":"succeeded","amount":100,"currency":"RUB","recipient":"shop","purpose":"order"}'::bytea, ARRAY[30]),
  array_fill(true, ARRAY[30]),
  array_fill(NULL::text, ARRAY[30]),
  array_fill(true, ARRAY[30]),
  array_fill(NULL::text, ARRAY[30]),
  array_fill(NULL::text, ARRAY[30]),
  p_reads_sealed => true) b
) x WHERE k IS NOT NULL AND t IS NOT NULL
\gset
