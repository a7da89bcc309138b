-- Group commit, set-based: a batch's completions, releases and new keys each in one
-- statement over the arrays, instead of one statement per write.
--
-- Why: profiled under keyed load (perf, 2026-12-03), 82 % of PostgreSQL's CPU went into
-- the batch function, a fifth of it starting the executor for each write's statements
-- (and a table function call per reservation). One statement per kind starts it once per
-- batch. What only the row can decide — keys that already have a row (replays, keys in
-- progress, reuse with another request, takeovers) and writes whose token is gone — still
-- goes one by one, through idempotency_reserve() as before.
--
-- Their plans are cached per connection, and a plan made while the table was small
-- (a new deployment) would stay: measured, an UPDATE that scanned every key in progress
-- for each batch, ten times slower than one statement per write. So the function plans
-- with sequential scans, hash and merge joins off (its statements are lookups by primary
-- key, whatever the table's size), and the fence is written `status <> 'done'`, which the
-- partial index of keys in progress cannot serve. Replanning each batch (EXECUTE) instead
-- cost more than it saved.
--
-- The outcomes are the ones of one order of the batch's writes: completions and releases
-- first, then reservations (the writes of a batch were all waiting at once, so any order
-- is one the clients could have seen). Same signature and results as 0007's form.
CREATE OR REPLACE FUNCTION idempotency_batch(
    p_op           text[],     -- reserve | complete | release
    p_client_id    text[],
    p_key          text[],
    p_fingerprint  bytea[],    -- reserve
    p_route        text[],     -- reserve
    p_lease_ms     bigint[],   -- reserve
    p_retention_ms bigint[],   -- reserve; complete: counted from the completion
    p_token        bigint[],   -- complete, release: the fence
    p_status       smallint[], -- complete
    p_headers      bytea[],    -- complete
    p_body         bytea[],    -- complete
    p_replayable   boolean[],  -- complete
    p_notify       text[],     -- complete, release: payload to wake waiters with, or NULL
    p_takeover     boolean[],  -- reserve: whether an expired lease may be taken over
    p_derived_key  text[] DEFAULT NULL, -- reserve: the derived key to keep, or NULL (plain)
    p_sealed_with  text[] DEFAULT NULL, -- complete: the ring key the answer is sealed with
    p_reads_sealed boolean DEFAULT false -- reserve: whether the caller opens sealed answers
) RETURNS TABLE (
    o_index              integer,
    o_outcome            text,
    o_lease_token        bigint,
    o_attempts           integer,
    o_lease_remaining_ms bigint,
    o_response_status    smallint,
    o_response_headers   bytea,
    o_response_body      bytea,
    o_replayable         boolean,
    o_expires_in_ms      bigint,
    o_derived_key        text,
    o_sealed_with        text
) LANGUAGE plpgsql
  SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$

DECLARE
    n integer := coalesce(array_length(p_op, 1), 0);
    answered boolean[] := array_fill(false, ARRAY[coalesce(array_length(p_op, 1), 0)]);
    rec record;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;

    -- Completions, in one statement: each applies only while its row still carries its
    -- lease token.
    FOR rec IN
        UPDATE idempotency_keys k
            SET status = 'done', locked_until = NULL, completed_at = now(),
                expires_at = now() + c.retention_ms * interval '1 millisecond',
                response_status = c.status, response_headers = c.headers,
                response_body = c.body, replayable = c.replayable,
                sealed_with = c.sealed_with
           FROM unnest(p_op, p_client_id, p_key, p_token, p_retention_ms, p_status, p_headers, p_body, p_replayable, p_sealed_with, p_notify)
                WITH ORDINALITY AS c(op, client_id, key, token, retention_ms, status, headers,
                                     body, replayable, sealed_with, notify, i)
          WHERE c.op = 'complete'
            AND k.client_id = c.client_id AND k.key = c.key
            AND k.lease_token = c.token AND k.status <> 'done'
         RETURNING c.i, c.notify
    LOOP
        answered[rec.i] := true;
        IF rec.notify IS NOT NULL THEN
            PERFORM pg_notify('idemproxy_done', rec.notify);
        END IF;
        o_index := rec.i;
        o_outcome := 'applied';
        RETURN NEXT;
    END LOOP;

    -- Releases, in one statement, on the same condition.
    FOR rec IN
        DELETE FROM idempotency_keys k
          USING unnest(p_op, p_client_id, p_key, p_token, p_notify)
                WITH ORDINALITY AS c(op, client_id, key, token, notify, i)
          WHERE c.op = 'release'
            AND k.client_id = c.client_id AND k.key = c.key
            AND k.lease_token = c.token AND k.status <> 'done'
         RETURNING c.i, c.notify
    LOOP
        answered[rec.i] := true;
        IF rec.notify IS NOT NULL THEN
            PERFORM pg_notify('idemproxy_done', rec.notify);
        END IF;
        o_index := rec.i;
        o_outcome := 'applied';
        RETURN NEXT;
    END LOOP;

    -- New keys, in one statement: the first reservation of each key no row has yet,
    -- inserted in key order (two batches lock the same keys in the same order).
    FOR rec IN
        WITH firsts AS (
             SELECT DISTINCT ON (u.client_id, u.key) u.*
               FROM unnest(p_op, p_client_id, p_key, p_fingerprint, p_route, p_lease_ms, p_retention_ms, p_derived_key)
                    WITH ORDINALITY AS u(op, client_id, key, fingerprint, route, lease_ms,
                                         retention_ms, derived_key, i)
              WHERE u.op = 'reserve'
                AND NOT EXISTS (SELECT 1 FROM idempotency_keys e
                                 WHERE e.client_id = u.client_id AND e.key = u.key)
              ORDER BY u.client_id, u.key, u.i
         ), inserted AS (
             INSERT INTO idempotency_keys AS k
                 (client_id, key, route, fingerprint, lease_token, locked_until, expires_at,
                  derived_key)
             SELECT f.client_id, f.key, f.route, f.fingerprint,
                    nextval('idempotency_lease_token_seq'),
                    now() + f.lease_ms * interval '1 millisecond',
                    now() + f.retention_ms * interval '1 millisecond', f.derived_key
               FROM firsts f
              ORDER BY f.client_id, f.key
             ON CONFLICT (client_id, key) DO NOTHING
             RETURNING k.client_id, k.key, k.lease_token, k.attempts, k.derived_key
         )
         SELECT f.i, ins.lease_token, ins.attempts, ins.derived_key
           FROM inserted ins
           JOIN firsts f ON f.client_id = ins.client_id AND f.key = ins.key
    LOOP
        answered[rec.i] := true;
        o_index := rec.i;
        o_outcome := 'reserved';
        o_lease_token := rec.lease_token;
        o_attempts := rec.attempts;
        o_derived_key := rec.derived_key;
        RETURN NEXT;
    END LOOP;
    o_lease_token := NULL;
    o_attempts := NULL;
    o_derived_key := NULL;

    -- The rest one by one: reservations of keys that have a row (replays, keys in
    -- progress, reuse with another request, takeovers; a duplicate within this batch sees
    -- the row inserted above), and completions and releases that found their token gone.
    FOR i IN 1 .. n LOOP
        CONTINUE WHEN answered[i];
        o_index := i;
        IF p_op[i] = 'reserve' THEN
            SELECT r.o_outcome, r.o_lease_token, r.o_attempts, r.o_lease_remaining_ms,
                   r.o_response_status, r.o_response_headers, r.o_response_body, r.o_replayable,
                   r.o_expires_in_ms, r.o_derived_key, r.o_sealed_with
              INTO o_outcome, o_lease_token, o_attempts, o_lease_remaining_ms,
                   o_response_status, o_response_headers, o_response_body, o_replayable,
                   o_expires_in_ms, o_derived_key, o_sealed_with
              FROM idempotency_reserve(p_client_id[i], p_key[i], p_fingerprint[i], p_route[i],
                                       p_lease_ms[i], p_retention_ms[i],
                                       coalesce(p_takeover[i], true), p_derived_key[i],
                                       coalesce(p_reads_sealed, false)) r;
        ELSIF p_op[i] IN ('complete', 'release') THEN
            o_outcome := 'refused';
            o_lease_token := NULL;
            o_attempts := NULL;
            o_lease_remaining_ms := NULL;
            o_response_status := NULL;
            o_response_headers := NULL;
            o_response_body := NULL;
            o_replayable := NULL;
            o_expires_in_ms := NULL;
            o_derived_key := NULL;
            o_sealed_with := NULL;
        ELSE
            RAISE EXCEPTION 'idempotency_batch: unknown operation %', p_op[i];
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
