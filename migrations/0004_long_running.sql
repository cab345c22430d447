-- Long-running sagas: durable waits for external events, migration records, claim checks.

ALTER TABLE saga_instances
    ADD COLUMN waiting_for   text,
    ADD COLUMN wait_schema   jsonb,
    ADD COLUMN wait_deadline timestamptz;

CREATE INDEX saga_instances_waiting
    ON saga_instances (name, waiting_for) WHERE waiting_for IS NOT NULL;

ALTER TABLE saga_steps DROP CONSTRAINT saga_steps_outcome_check;
ALTER TABLE saga_steps ADD CONSTRAINT saga_steps_outcome_check CHECK (outcome IN (
    'succeeded', 'failed', 'skipped', 'retrying', 'timed_out', 'ignored', 'migrated',
    'deadline_exceeded'));

-- Large payloads kept out of messages and saga data: only the id travels.
CREATE TABLE claim_checks (
    id           uuid        PRIMARY KEY,
    content_type text        NOT NULL,
    content      bytea       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz
);
CREATE INDEX claim_checks_expires_at ON claim_checks (expires_at) WHERE expires_at IS NOT NULL;
