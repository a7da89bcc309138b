-- Keys in progress by lease end: the reconciler, the unresolved-keys gauge, `/admin/stuck`
-- and `sweep.unresolved_retention` find unresolved keys through it instead of scanning the
-- table. Partial, so it holds only the few keys in flight or unresolved: a completed row
-- leaves it, and a reservation adds one small entry.
--
-- Built with CONCURRENTLY, outside a transaction, so that a large table keeps taking
-- writes while it is built (`idemproxy migrate` runs this statement on its own and records
-- the version only once the index is valid).
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_unresolved
    ON idempotency_keys (locked_until) WHERE status = 'in_progress'
