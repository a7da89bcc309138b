-- Stored answers sealed at rest (`encryption:`): the ring key an answer is sealed with is
-- kept in its row (NULL: in clear, as in every older row), and a replay hands the proxy the
-- row's lease token, which the sealed answer is bound to.
--
-- A caller that does not say it opens sealed answers (`p_reads_sealed`, as every binary
-- before this migration) gets an error for a sealed row instead of its ciphertext: an old
-- replica left running beside encrypting ones fails closed (503) rather than replaying
-- bytes it cannot read as the answer.
--
-- Both functions gain defaulted last parameters and a last result column, so callers of the
-- previous forms (naming their arguments and columns) are unaffected; they are dropped and
-- created again in this migration's transaction.
ALTER TABLE idempotency_keys ADD COLUMN sealed_with text;

DROP FUNCTION idempotency_batch(text[], text[], text[], bytea[], text[], bigint[], bigint[],
                                bigint[], smallint[], bytea[], bytea[], boolean[], text[],
                                boolean[], text[]);
DROP FUNCTION idempotency_reserve(text, text, bytea, text, bigint, bigint, boolean, text);

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

        UPDATE idempotency_keys k
           SET lease_token  = nextval('idempotency_lease_token_seq'),
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
-- parallel arrays, one element per write, sorted by (client_id, key) so that two batches
-- running at once take their row locks in the same order and cannot deadlock.
--
-- Each write keeps its own outcome, one row per element (o_index, 1-based): a reservation
-- answers as idempotency_reserve() does; a completion or release answers `applied` (the
-- row still carried its lease token and was written) or `refused` (it was taken over or
-- evicted). A write that raises an error aborts the whole batch, which the proxy then
-- runs one write at a time, so that only that write fails.
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
) LANGUAGE plpgsql AS $$
DECLARE
    n integer := coalesce(array_length(p_op, 1), 0);
BEGIN
    FOR i IN 1 .. n LOOP
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
        ELSE
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
            IF p_op[i] = 'complete' THEN
                UPDATE idempotency_keys k
                   SET status = 'done', locked_until = NULL, completed_at = now(),
                       expires_at = now() + p_retention_ms[i] * interval '1 millisecond',
                       response_status = p_status[i], response_headers = p_headers[i],
                       response_body = p_body[i], replayable = p_replayable[i],
                       sealed_with = p_sealed_with[i]
                 WHERE k.client_id = p_client_id[i] AND k.key = p_key[i]
                   AND k.lease_token = p_token[i] AND k.status = 'in_progress';
            ELSIF p_op[i] = 'release' THEN
                DELETE FROM idempotency_keys k
                 WHERE k.client_id = p_client_id[i] AND k.key = p_key[i]
                   AND k.lease_token = p_token[i] AND k.status = 'in_progress';
            ELSE
                RAISE EXCEPTION 'idempotency_batch: unknown operation %', p_op[i];
            END IF;
            IF FOUND THEN
                o_outcome := 'applied';
                IF p_notify[i] IS NOT NULL THEN
                    PERFORM pg_notify('idemproxy_done', p_notify[i]);
                END IF;
            ELSE
                o_outcome := 'refused';
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
