-- A retry of a completed key (a replay) is only a read: idempotency_reserve() now looks the
-- row up first and returns at once when it exists, instead of attempting an INSERT (and
-- drawing a lease token from the sequence) on every call. A new key costs one more index
-- lookup in the same round trip. Same signature, same outcomes, same races handled: a row
-- inserted between the look-up and the INSERT makes the INSERT do nothing, and the loop
-- looks again.
CREATE OR REPLACE FUNCTION idempotency_reserve(
    p_client_id    text,
    p_key          text,
    p_fingerprint  bytea,
    p_route        text,
    p_lease_ms     bigint,
    p_retention_ms bigint
) RETURNS TABLE (
    o_outcome            text,     -- reserved | taken_over | in_progress | mismatch | done
    o_lease_token        bigint,
    o_attempts           integer,
    o_lease_remaining_ms bigint,
    o_response_status    smallint,
    o_response_headers   bytea,
    o_response_body      bytea,
    o_replayable         boolean
) LANGUAGE plpgsql AS $$
DECLARE
    r idempotency_keys%ROWTYPE;
BEGIN
    LOOP
        SELECT * INTO r FROM idempotency_keys k WHERE k.client_id = p_client_id AND k.key = p_key;
        IF NOT FOUND THEN
            INSERT INTO idempotency_keys AS k
                (client_id, key, route, fingerprint, lease_token, locked_until, expires_at)
            VALUES
                (p_client_id, p_key, p_route, p_fingerprint, nextval('idempotency_lease_token_seq'),
                 now() + p_lease_ms * interval '1 millisecond',
                 now() + p_retention_ms * interval '1 millisecond')
            ON CONFLICT (client_id, key) DO NOTHING
            RETURNING k.lease_token, k.attempts INTO o_lease_token, o_attempts;
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
            o_outcome := 'done';
            o_response_status := r.response_status;
            o_response_headers := r.response_headers;
            o_response_body := r.response_body;
            o_replayable := r.replayable;
            o_attempts := r.attempts;
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

        UPDATE idempotency_keys k
           SET lease_token  = nextval('idempotency_lease_token_seq'),
               locked_until = now() + p_lease_ms * interval '1 millisecond',
               attempts     = k.attempts + 1,
               expires_at   = now() + p_retention_ms * interval '1 millisecond'
         WHERE k.client_id = p_client_id AND k.key = p_key
           AND k.status = 'in_progress'
           AND k.locked_until < now()
           AND k.fingerprint = p_fingerprint
        RETURNING k.lease_token, k.attempts INTO o_lease_token, o_attempts;
        IF FOUND THEN
            o_outcome := 'taken_over';
            RETURN NEXT;
            RETURN;
        END IF;
        -- The row changed under us (renewed, completed, taken over or released): look again.
    END LOOP;
END
$$;
