-- Operations: dead-letter lifecycle and replay history, retention indexes, operator views.

ALTER TABLE dead_letters
    ADD COLUMN status           text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'replayed', 'purged')),
    ADD COLUMN replay_count     integer     NOT NULL DEFAULT 0,
    ADD COLUMN last_replayed_at timestamptz,
    ADD COLUMN purged_at        timestamptz;

CREATE INDEX dead_letters_pending ON dead_letters (last_failed_at) WHERE status = 'pending';

-- One row per `saga dlq replay` (or resume) run: when, by whom, what, how many, the result.
CREATE TABLE dead_letter_replays (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    replayed_at     timestamptz NOT NULL DEFAULT now(),
    replayed_by     text        NOT NULL DEFAULT current_user,
    criteria        jsonb       NOT NULL,
    dead_letter_ids bigint[]    NOT NULL,
    replayed        integer     NOT NULL,
    refused         integer     NOT NULL,
    result          text        NOT NULL
);

CREATE INDEX saga_instances_finished_at
    ON saga_instances (finished_at) WHERE finished_at IS NOT NULL;

-- Sagas that did not complete, with the step and error that stopped them.
CREATE VIEW saga_failures AS
SELECT id, name, saga_version, status, step, last_error, started_at, updated_at, finished_at
FROM saga_instances
WHERE status IN ('compensated', 'compensation_failed', 'forward_failed')
   OR (status = 'compensating');

-- Dead letters awaiting an operator, grouped the way they are usually triaged.
CREATE VIEW dead_letter_summary AS
SELECT consumer, reason, error_type, count(*) AS letters,
       min(first_failed_at) AS oldest, max(last_failed_at) AS newest
FROM dead_letters
WHERE status = 'pending'
GROUP BY consumer, reason, error_type;
