-- `client_id` and `key` in byte order (collation "C"), and 0010's index as the primary key.
--
-- The old primary key is dropped and the columns change collation in one statement: the
-- table is not rewritten (same type) and 0010's index, already in byte order, is kept
-- as it is rather than rebuilt, so the statement holds its lock for milliseconds whatever
-- the table's size. Every statement and function that compares the columns now compares
-- bytes (`k.key = c.key` takes the column's collation over an argument's default one),
-- and keeps using the primary key's index.
ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_pkey,
    ALTER COLUMN client_id TYPE text COLLATE "C",
    ALTER COLUMN key TYPE text COLLATE "C";
ALTER TABLE idempotency_keys
    ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY USING INDEX idempotency_keys_key_c;
