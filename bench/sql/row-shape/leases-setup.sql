-- leases: the design measured for HOT completions (issue 57, not built). The keys in
-- progress leave the key table's indexes for a small table of leases, inserted at
-- reservation and deleted at completion; the expiry is set at reservation and left alone
-- (the sweep would add the completion's delay), so a completion changes no indexed column.
DROP INDEX idempotency_keys_unresolved;
CREATE TABLE idempotency_leases (
    client_id    text COLLATE "C" NOT NULL,
    key          text COLLATE "C" NOT NULL,
    locked_until timestamptz NOT NULL,
    PRIMARY KEY (client_id, key)
);
CREATE INDEX idempotency_leases_locked_until ON idempotency_leases (locked_until);
