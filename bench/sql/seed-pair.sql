-- The seed article's handler for a new key, one request at a time: its reserve, then its
-- completion, each statement committed on its own (autocommit, as in the article).
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
