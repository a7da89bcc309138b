-- What the recovery probe last answered for an unresolved key ("503", "no answer"), so that
-- the operator's console and `/admin/stuck` can say why the reconciler has not settled it.
-- NULL until an inconclusive probe writes it. Adding a nullable column without a default
-- does not rewrite the table: the statement holds its lock for milliseconds.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS probe_answer text;
