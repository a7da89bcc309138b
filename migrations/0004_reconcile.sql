-- The reconciler's bookkeeping for unresolved keys (in progress, lease run out): how many
-- times the recovery probe was asked without a conclusive answer, and when it may be asked
-- again (backoff, shared by every replica).
--
-- Both columns are added without rewriting the table (a constant default), and neither is
-- indexed, so a renewal or completion that leaves them alone changes nothing it did before.
ALTER TABLE idempotency_keys
    ADD COLUMN probes      integer NOT NULL DEFAULT 0,
    ADD COLUMN probe_after timestamptz;
