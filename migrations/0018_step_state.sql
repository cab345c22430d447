-- What one kind of step keeps while a saga is at it (a wait: the event, its key, schema
-- and deadline) lives in one JSON document, the step's state, instead of columns of its
-- own. The event waited for and its key stay queryable (and indexed) as columns computed
-- from that document.

ALTER TABLE saga_instances ADD COLUMN step_state jsonb NOT NULL DEFAULT '{}';

UPDATE saga_instances SET step_state = jsonb_strip_nulls(jsonb_build_object(
    'waiting_for', waiting_for,
    'wait_key', wait_key,
    'wait_schema', wait_schema,
    'wait_deadline', wait_deadline))
WHERE waiting_for IS NOT NULL;

DROP INDEX saga_instances_waiting;
DROP INDEX saga_instances_wait_key;
ALTER TABLE saga_instances
    DROP COLUMN waiting_for,
    DROP COLUMN wait_schema,
    DROP COLUMN wait_deadline,
    DROP COLUMN wait_key;
ALTER TABLE saga_instances
    ADD COLUMN waiting_for text GENERATED ALWAYS AS (step_state ->> 'waiting_for') STORED,
    ADD COLUMN wait_key text GENERATED ALWAYS AS (step_state ->> 'wait_key') STORED;
CREATE INDEX saga_instances_waiting
    ON saga_instances (name, waiting_for) WHERE waiting_for IS NOT NULL;
CREATE INDEX saga_instances_wait_key
    ON saga_instances (waiting_for, wait_key) WHERE wait_key IS NOT NULL;
