-- Closed steps: a participant records, with the compensation it handles, that the step it
-- undoes is closed; a forward command for a closed step is never executed (a replay, or a
-- command overtaken by its compensation). A saga step whose command was dead-lettered can
-- be held for an operator ('step_dead_lettered') instead of compensating.

CREATE TABLE closed_steps (
    step_key  text        PRIMARY KEY,
    consumer  text        NOT NULL,
    closed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX closed_steps_closed_at ON closed_steps USING brin (closed_at);

ALTER TABLE saga_instances DROP CONSTRAINT saga_instances_status_check;
ALTER TABLE saga_instances ADD CONSTRAINT saga_instances_status_check CHECK (status IN (
    'running', 'compensating', 'completed', 'compensated', 'compensation_failed',
    'forward_failed', 'step_dead_lettered'));

ALTER TABLE saga_steps DROP CONSTRAINT saga_steps_outcome_check;
ALTER TABLE saga_steps ADD CONSTRAINT saga_steps_outcome_check CHECK (outcome IN (
    'succeeded', 'failed', 'skipped', 'retrying', 'timed_out', 'ignored', 'migrated',
    'deadline_exceeded', 'held', 'late_success'));

CREATE OR REPLACE VIEW saga_failures AS
SELECT id, name, saga_version, status, step, last_error, started_at, updated_at, finished_at
FROM saga_instances
WHERE status IN ('compensated', 'compensation_failed', 'forward_failed', 'step_dead_lettered')
   OR (status = 'compensating');
