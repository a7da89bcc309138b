-- The key table: one row per (client_id, key), reserved before the request is forwarded.
--
-- The primary key is the unique index that picks the winner among concurrent duplicates.
-- Only `expires_at` is indexed besides it, and it is written at reservation time, so that
-- renewals and completions are HOT updates (no index maintenance on the hot path); the
-- fillfactor leaves room on each page for them.
CREATE TABLE idempotency_keys (
    client_id        text        NOT NULL,
    key              text        NOT NULL,
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
    PRIMARY KEY (client_id, key)
) WITH (fillfactor = 80);

CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);

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

        SELECT * INTO r FROM idempotency_keys k WHERE k.client_id = p_client_id AND k.key = p_key;
        IF NOT FOUND THEN
            CONTINUE;  -- released or evicted between the two statements: try again
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
