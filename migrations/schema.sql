-- The PostgreSQL schema as the last migration (0013) leaves it, in one place, for reading:
-- the key table, its indexes, and the current PL/pgSQL functions. It is never applied —
-- `idemproxy migrate` applies the numbered migrations beside it, which are the history
-- (a function redefined in five of them is read here once). A test builds a schema from
-- this file and one from the migrations and checks that they are the same
-- (`tests/it/schema.rs`): a migration that changes the schema changes this file too.

-- The key table: one row per (client_id, key), reserved before the request is forwarded.
--
-- The primary key is the unique index that picks the winner among concurrent duplicates.
-- `expires_at` is indexed for the sweep, and the keys in progress by lease end (0005).
-- `client_id` and `key` are opaque bytes, compared and indexed in byte order (collation
-- "C", 0010 and 0011): no query needs them in a language's order, and the database's
-- default collation would compare them through strcoll on every index descent.
CREATE TABLE idempotency_keys (
    client_id        text        COLLATE "C" NOT NULL,
    key              text        COLLATE "C" NOT NULL,
    route            text        NOT NULL,
    fingerprint      bytea       NOT NULL,
    status           text        NOT NULL DEFAULT 'in_progress'
                                 CHECK (status IN ('in_progress', 'done')),
    -- Fencing token of the current reservation; fresh on every reservation and takeover.
    lease_token      bigint      NOT NULL,
    -- Lease end, by the database clock; NULL once done.
    locked_until     timestamptz,
    attempts         integer     NOT NULL DEFAULT 1,
    response_status  smallint,
    -- Allow-listed headers in HTTP/1 block form ("name: value\r\n"...).
    response_headers bytea,
    response_body    bytea,
    -- false: done, but the answer was too large to store (retries get a problem).
    replayable       boolean,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    -- When the row may be swept: reservation time + the route's retention.
    expires_at       timestamptz NOT NULL,
    -- The reconciler's bookkeeping for unresolved keys: how many times the recovery probe
    -- was asked without a conclusive answer, and when it may be asked again (0004).
    probes           integer     NOT NULL DEFAULT 0,
    probe_after      timestamptz,
    -- The derived key a reservation sent upstream, so that a takeover sends the same one;
    -- NULL: the plain form `client_id:key` (0006).
    derived_key      text,
    -- The ring key the stored answer is sealed with; NULL: in clear (0007).
    sealed_with      text,
    -- What the recovery probe last answered for an unresolved key ("503", "no answer")
    -- (0012).
    probe_answer     text,
    PRIMARY KEY (client_id, key)
) WITH (fillfactor = 80);

CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);

-- Keys in progress by lease end: the reconciler, the unresolved-keys gauge, `/admin/stuck`
-- and `sweep.unresolved_retention` find unresolved keys through it instead of scanning the
-- table. Partial, so it holds only the few keys in flight or unresolved.
CREATE INDEX idempotency_keys_unresolved
    ON idempotency_keys (locked_until) WHERE status = 'in_progress';

-- Lease tokens come from one sequence so that a token is never handed out twice, even
-- after a row is released or evicted and the same key is reserved again.
CREATE SEQUENCE idempotency_lease_token_seq;

-- Reserve a key in one round trip: insert it in progress, or take over an expired lease
-- with the same fingerprint, or report what the existing row says.
--
-- Under READ COMMITTED each statement here sees rows committed before it started, so the
-- SELECT after a conflicting INSERT sees the winner's row; the takeover UPDATE re-checks
-- its conditions on the latest row version, so two concurrent takeovers cannot both win.
CREATE FUNCTION idempotency_reserve(
    p_client_id    text,
    p_key          text,
    p_fingerprint  bytea,
    p_route        text,
    p_lease_ms     bigint,
    p_retention_ms bigint,
    p_takeover     boolean DEFAULT true,
    p_derived_key  text DEFAULT NULL,
    p_reads_sealed boolean DEFAULT false
) RETURNS TABLE (
    o_outcome            text,     -- reserved | taken_over | in_progress | mismatch | done | unresolved
    o_lease_token        bigint,
    o_attempts           integer,
    o_lease_remaining_ms bigint,
    o_response_status    smallint,
    o_response_headers   bytea,
    o_response_body      bytea,
    o_replayable         boolean,
    o_expires_in_ms      bigint,   -- done: how much longer the row is kept
    o_derived_key        text,     -- reserved, taken_over: the derived key to send (NULL: plain)
    o_sealed_with        text      -- done: the ring key the answer is sealed with (NULL: clear)
) LANGUAGE plpgsql AS $$
DECLARE
    r idempotency_keys%ROWTYPE;
    v_token bigint;
BEGIN
    LOOP
        SELECT * INTO r FROM idempotency_keys k WHERE k.client_id = p_client_id AND k.key = p_key;
        IF NOT FOUND THEN
            INSERT INTO idempotency_keys AS k
                (client_id, key, route, fingerprint, lease_token, locked_until, expires_at,
                 derived_key)
            VALUES
                (p_client_id, p_key, p_route, p_fingerprint, nextval('idempotency_lease_token_seq'),
                 now() + p_lease_ms * interval '1 millisecond',
                 now() + p_retention_ms * interval '1 millisecond', p_derived_key)
            ON CONFLICT (client_id, key) DO NOTHING
            RETURNING k.lease_token, k.attempts, k.derived_key
                 INTO o_lease_token, o_attempts, o_derived_key;
            IF FOUND THEN
                o_outcome := 'reserved';
                RETURN NEXT;
                RETURN;
            END IF;
            CONTINUE;  -- inserted by someone else meanwhile: look again
        END IF;
        IF r.fingerprint <> p_fingerprint THEN
            o_outcome := 'mismatch';
            RETURN NEXT;
            RETURN;
        END IF;
        IF r.status = 'done' THEN
            IF r.sealed_with IS NOT NULL AND NOT p_reads_sealed THEN
                RAISE EXCEPTION 'idempotency_reserve: the stored answer is encrypted (key %) and this caller cannot read it; upgrade every idemproxy replica', r.sealed_with
                    USING ERRCODE = 'feature_not_supported';
            END IF;
            o_outcome := 'done';
            o_lease_token := r.lease_token;
            o_sealed_with := r.sealed_with;
            o_response_status := r.response_status;
            o_response_headers := r.response_headers;
            o_response_body := r.response_body;
            o_replayable := r.replayable;
            o_attempts := r.attempts;
            o_expires_in_ms := floor(extract(epoch FROM r.expires_at - now()) * 1000)::bigint;
            RETURN NEXT;
            RETURN;
        END IF;
        IF r.locked_until >= now() THEN
            o_outcome := 'in_progress';
            o_lease_remaining_ms := ceil(extract(epoch FROM r.locked_until - now()) * 1000)::bigint;
            o_attempts := r.attempts;
            RETURN NEXT;
            RETURN;
        END IF;

        IF NOT p_takeover THEN
            o_outcome := 'unresolved';
            o_attempts := r.attempts;
            RETURN NEXT;
            RETURN;
        END IF;

        -- The token is taken first: Citus refuses a volatile function in a distributed
        -- UPDATE. A token taken for an UPDATE that finds the row changed is never used.
        v_token := nextval('idempotency_lease_token_seq');
        UPDATE idempotency_keys k
           SET lease_token  = v_token,
               locked_until = now() + p_lease_ms * interval '1 millisecond',
               attempts     = k.attempts + 1,
               expires_at   = now() + p_retention_ms * interval '1 millisecond'
         WHERE k.client_id = p_client_id AND k.key = p_key
           AND k.status = 'in_progress'
           AND k.locked_until < now()
           AND k.fingerprint = p_fingerprint
        RETURNING k.lease_token, k.attempts, k.derived_key
             INTO o_lease_token, o_attempts, o_derived_key;
        IF FOUND THEN
            o_outcome := 'taken_over';
            RETURN NEXT;
            RETURN;
        END IF;
        -- The row changed under us (renewed, completed, taken over or released): look again.
    END LOOP;
END
$$;

-- Group commit: several reservations, completions and releases in one round trip and one
-- commit. The proxy collects the writes of concurrent requests and sends them here as
-- parallel arrays, one element per write, sorted by (client_id, key); new keys are
-- inserted in that order, so two batches take those locks in the same order.
--
-- Set-based (0009): completions, releases and new keys each in one statement over the
-- arrays (the executor starts once per batch, not once per write), planned as primary-key
-- lookups whatever the table's size; what only the row can decide — keys that have a row,
-- writes whose token is gone — one by one after them. The outcomes are those of one order
-- of the batch's writes: completions and releases first.
--
-- Each write keeps its own outcome, one row per element (o_index, 1-based, rows in any
-- order): a reservation answers as idempotency_reserve() does; a completion or release
-- answers `applied` (the row still carried its lease token and was written) or `refused`
-- (it was taken over or evicted). A write that raises an error aborts the whole batch,
-- which the proxy then runs one write at a time, so that only that write fails (a
-- deadlock with another batch, possible only around a takeover, ends the same way).
CREATE FUNCTION idempotency_batch(
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

-- The form idempotency keys are stored in (`encryption.hash_keys`): `clear`, or
-- `hmac-sha256:` and a verifier of the hashing secret. A proxy configured for another form
-- would not find the stored keys — every retry a second execution — so it refuses to start
-- while keys are stored (`idempotency_settle_key_form`).
CREATE TABLE idemproxy_settings (
    name  text PRIMARY KEY,
    value text NOT NULL
);

-- Records `p_form` as the store's key form when the store holds no keys in another one, and
-- returns the form in force: `p_form` when it is agreed, the stored one when it differs and
-- keys are stored. Rows from before this migration, with nothing recorded, are in clear.
-- The lock makes two proxies starting at once take turns.
CREATE FUNCTION idempotency_settle_key_form(p_form text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_form text;
BEGIN
    LOCK TABLE idemproxy_settings IN SHARE ROW EXCLUSIVE MODE;
    SELECT value INTO v_form FROM idemproxy_settings WHERE name = 'key_form';
    IF v_form = p_form THEN
        RETURN p_form;
    END IF;
    IF EXISTS (SELECT 1 FROM idempotency_keys) THEN
        v_form := coalesce(v_form, 'clear');
        IF v_form <> p_form THEN
            RETURN v_form;
        END IF;
    END IF;
    INSERT INTO idemproxy_settings (name, value) VALUES ('key_form', p_form)
        ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value;
    RETURN p_form;
END;
$$;
