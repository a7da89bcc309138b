-- The seed article's table, as the article writes it: the baseline's own storage.
create table if not exists idempotency (
    client_id    text        not null,
    key          text        not null,
    fingerprint  text        not null,
    status       text        not null default 'in_progress',
    locked_until timestamptz not null default now() + interval '30 seconds',
    status_code  int,
    response     jsonb,
    created_at   timestamptz not null default now(),
    primary key (client_id, key)
);
