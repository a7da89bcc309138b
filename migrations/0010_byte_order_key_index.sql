-- The primary key's index again, in byte order (collation "C"), built beside the old one.
--
-- Why: the key table's text columns took the database's default collation. Under any
-- collation but "C" PostgreSQL orders text through the C library (strcoll), and every
-- reservation descends the primary key's B-tree comparing `client_id` and `key` that way:
-- profiled under keyed load (perf, 2026-12-03, a C.UTF-8 database) 14 % of PostgreSQL's CPU
-- per write went into those comparisons; under en_US.UTF-8 they cost more. The keys are
-- opaque bytes — no query needs them in a language's order, and equality is byte equality
-- under every deterministic collation — so byte order gives the same answers for less.
--
-- Built with CONCURRENTLY, outside a transaction, so that a large table keeps taking
-- writes while it is built (`idemproxy migrate` records the version only once the index is
-- valid). Unique from the start: the primary key already makes every (client_id, key)
-- unique byte for byte. Migration 0011 makes it the primary key.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_key_c
    ON idempotency_keys (client_id COLLATE "C", key COLLATE "C")
