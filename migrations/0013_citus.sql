-- The key table on Citus (a coordinator and workers, the table distributed by client_id):
-- what the server refuses on a distributed table is written the way it accepts.
--
-- A takeover takes its fresh lease token into a variable before its UPDATE: Citus refuses
-- a volatile function (nextval) in the SET of an UPDATE on a distributed table ("functions
-- used in UPDATE queries on distributed tables must not be VOLATILE"), and every takeover
-- failed there. On one PostgreSQL the outcome is the same; the only difference is a token
-- left unused when the row changed under the UPDATE (tokens need only never repeat).
-- Same signature and results as 0007's form.
CREATE OR REPLACE FUNCTION idempotency_reserve(
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
