-- Finding a saga by what the business knows, and knowing why it failed.
-- A start's idempotency key keeps a fingerprint of the data it started with, so a key
-- reused with other data is refused instead of silently answered with the first saga.
-- A saga that compensates keeps the step that failed in its own column, for
-- saga_failures. `saga list --key` and `--data field=value` read through these indexes.

ALTER TABLE saga_instances ADD COLUMN idempotency_fingerprint text;
ALTER TABLE saga_instances ADD COLUMN failed_step text;

CREATE INDEX saga_instances_idempotency_key
    ON saga_instances (idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX saga_instances_data ON saga_instances USING gin (data jsonb_path_ops);

-- For a saga that compensated (or is compensating), `step` is the forward step that failed
-- (the one `last_error` names); for the others, the step it stopped at.
CREATE OR REPLACE VIEW saga_failures AS
SELECT id, name, saga_version, status,
       CASE WHEN status IN ('compensated', 'compensating') THEN failed_step ELSE step END
           AS step,
       last_error, started_at, updated_at, finished_at
FROM saga_instances
WHERE status IN ('compensated', 'compensation_failed', 'forward_failed', 'step_dead_lettered')
   OR (status = 'compensating');
