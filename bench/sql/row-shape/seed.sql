-- seed: the seed article's table and its reserve and completion (bench/sql/seed-pair.sql).
\set r random(1, 1000000000000)
insert into idempotency (client_id, key, fingerprint)
values ('pgbench-' || :client_id, 'k' || :r, 'fp')
on conflict (client_id, key) do update
    set locked_until = now() + interval '30 seconds'
    where idempotency.status = 'in_progress'
      and idempotency.locked_until < now()
      and idempotency.fingerprint = excluded.fingerprint
returning true;
update idempotency set status = 'done', status_code = 201, response = '{"charge_id": 1, "amount": 100}'
where client_id = 'pgbench-' || :client_id and key = 'k' || :r;
