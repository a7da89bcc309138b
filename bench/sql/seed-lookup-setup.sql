-- 1,000 completed keys in the seed's table for seed-lookup.sql to read.
insert into idempotency (client_id, key, fingerprint, status, status_code, response)
select 'pgbench-replay', 'k' || g, 'fp', 'done', 201, '{"charge_id": 1, "amount": 100}'
from generate_series(0, 999) g
on conflict do nothing;
