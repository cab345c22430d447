-- Sagas: one row per saga instance in its home (orchestrator) database, and a step log.

CREATE TABLE saga_instances (
    id                 uuid        PRIMARY KEY,
    name               text        NOT NULL,
    saga_version       integer     NOT NULL,
    service            text        NOT NULL,
    status             text        NOT NULL CHECK (status IN (
                           'running', 'compensating', 'completed', 'compensated',
                           'compensation_failed', 'forward_failed')),
    step               text,
    data               jsonb       NOT NULL,
    completed_steps    text[]      NOT NULL DEFAULT '{}',
    pending_message_id uuid,
    step_attempt       integer     NOT NULL DEFAULT 1,
    cancel_requested   boolean     NOT NULL DEFAULT false,
    pivot_reached      boolean     NOT NULL DEFAULT false,
    last_error         text,
    idempotency_key    text,
    version            integer     NOT NULL DEFAULT 0,
    started_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    step_started_at    timestamptz,
    finished_at        timestamptz
);

CREATE UNIQUE INDEX saga_instances_idempotency
    ON saga_instances (name, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX saga_instances_unfinished
    ON saga_instances (status, updated_at) WHERE finished_at IS NULL;
CREATE INDEX saga_instances_name_status ON saga_instances (name, status, started_at);
CREATE INDEX saga_instances_started_at ON saga_instances USING brin (started_at);

ALTER TABLE saga_instances SET (fillfactor = 80);

CREATE TABLE saga_steps (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    saga_id     uuid        NOT NULL,
    step        text        NOT NULL,
    phase       text        NOT NULL CHECK (phase IN ('forward', 'compensation')),
    attempt     integer     NOT NULL DEFAULT 1,
    outcome     text        NOT NULL CHECK (outcome IN (
                    'succeeded', 'failed', 'skipped', 'retrying')),
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    error       text,
    message_id  uuid
);
CREATE INDEX saga_steps_saga ON saga_steps (saga_id, id);
CREATE INDEX saga_steps_finished_at ON saga_steps USING brin (finished_at);

-- The timeline an operator reads: every step attempt and compensation with its duration.
CREATE VIEW saga_timeline AS
SELECT s.saga_id, i.name AS saga_name, s.id AS seq, s.step, s.phase, s.attempt, s.outcome,
       s.started_at, s.finished_at,
       round(extract(epoch FROM s.finished_at - s.started_at) * 1000, 1) AS duration_ms,
       s.error, s.message_id
FROM saga_steps s
JOIN saga_instances i ON i.id = s.saga_id;
