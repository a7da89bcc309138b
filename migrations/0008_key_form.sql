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
