-- The declared schema: what applying every numbered migration must produce.
-- Read this file to see the current tables; change it together with a new migration.

CREATE TABLE outbox (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id    uuid        NOT NULL,
    destination   text,       -- NULL: an event, published to its type's subscribers
    message_type  text        NOT NULL,
    saga_id       uuid,
    body          bytea       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    deliver_after timestamptz,
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    leased        boolean     NOT NULL DEFAULT false  -- its writer publishes it until deliver_after
);

-- The relay claims ready rows in id order; scheduled rows wait in their own index
-- so that millions of future timers never slow the claim.
CREATE INDEX outbox_ready ON outbox (id) WHERE deliver_after IS NULL;
CREATE INDEX outbox_scheduled ON outbox (deliver_after) WHERE deliver_after IS NOT NULL;

-- A queue table: every row is inserted once and deleted once. Vacuum it often.
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.0,
    autovacuum_analyze_threshold = 5000
);

CREATE TABLE inbox (
    consumer    text        NOT NULL,
    message_id  uuid        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX inbox_received_at ON inbox USING brin (received_at);

CREATE TABLE dead_letters (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text        NOT NULL,
    reason          text        NOT NULL CHECK (reason IN ('rejected', 'failed', 'unpublishable')),
    message_id      uuid,
    message_type    text,
    saga_id         uuid,
    destination     text,
    content_type    text,
    body            bytea       NOT NULL,
    error_type      text        NOT NULL,
    error_message   text        NOT NULL,
    traceback       text,
    attempts        integer     NOT NULL DEFAULT 1,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at  timestamptz NOT NULL DEFAULT now(),
    status           text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'replayed', 'purged')),
    replay_count     integer     NOT NULL DEFAULT 0,
    last_replayed_at timestamptz,
    purged_at        timestamptz
);
CREATE INDEX dead_letters_consumer ON dead_letters (consumer, last_failed_at);
CREATE INDEX dead_letters_error_type ON dead_letters (error_type, last_failed_at);
CREATE INDEX dead_letters_message_id ON dead_letters (message_id);

CREATE TABLE saga_instances (
    id                 uuid        PRIMARY KEY,
    name               text        NOT NULL,
    saga_version       integer     NOT NULL,
    service            text        NOT NULL,
    status             text        NOT NULL CHECK (status IN (
                           'running', 'compensating', 'completed', 'compensated',
                           'compensation_failed', 'forward_failed', 'step_dead_lettered')),
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
    finished_at        timestamptz,
    idempotency_fingerprint text,
    failed_step        text,
    -- what the kind of step the saga is at keeps (a wait: its event, key, schema, deadline)
    step_state         jsonb       NOT NULL DEFAULT '{}',
    waiting_for        text GENERATED ALWAYS AS (step_state ->> 'waiting_for') STORED,
    wait_key           text GENERATED ALWAYS AS (step_state ->> 'wait_key') STORED
);

CREATE UNIQUE INDEX saga_instances_idempotency
    ON saga_instances (name, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX saga_instances_idempotency_key
    ON saga_instances (idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX saga_instances_data ON saga_instances USING gin (data jsonb_path_ops);
CREATE INDEX saga_instances_unfinished ON saga_instances (status) WHERE finished_at IS NULL;
CREATE INDEX saga_instances_name_status ON saga_instances (name, status, started_at);
CREATE INDEX saga_instances_started_at ON saga_instances USING brin (started_at);
CREATE INDEX saga_instances_waiting
    ON saga_instances (name, waiting_for) WHERE waiting_for IS NOT NULL;
CREATE INDEX saga_instances_wait_key
    ON saga_instances (waiting_for, wait_key) WHERE wait_key IS NOT NULL;

ALTER TABLE saga_instances SET (fillfactor = 80);

CREATE TABLE saga_steps (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    saga_id     uuid        NOT NULL,
    step        text        NOT NULL,
    phase       text        NOT NULL CHECK (phase IN ('forward', 'compensation')),
    attempt     integer     NOT NULL DEFAULT 1,
    outcome     text        NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    error       text,
    message_id  uuid
);
ALTER TABLE saga_steps ADD CONSTRAINT saga_steps_outcome_check CHECK (outcome IN (
    'succeeded', 'failed', 'skipped', 'retrying', 'timed_out', 'ignored', 'migrated',
    'deadline_exceeded', 'held', 'late_success'));
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

-- Sagas that did not complete, with the step and error that stopped them: for a saga that
-- compensated (or is compensating), the forward step that failed.
CREATE VIEW saga_failures AS
SELECT id, name, saga_version, status,
       CASE WHEN status IN ('compensated', 'compensating') THEN failed_step ELSE step END
           AS step,
       last_error, started_at, updated_at, finished_at
FROM saga_instances
WHERE status IN ('compensated', 'compensation_failed', 'forward_failed', 'step_dead_lettered')
   OR (status = 'compensating');

-- Dead letters awaiting an operator, grouped the way they are usually triaged.
CREATE VIEW dead_letter_summary AS
SELECT consumer, reason, error_type, count(*) AS letters,
       min(first_failed_at) AS oldest, max(last_failed_at) AS newest
FROM dead_letters
WHERE status = 'pending'
GROUP BY consumer, reason, error_type;

-- Large payloads kept out of messages and saga data: only the id travels.
CREATE TABLE claim_checks (
    id           uuid        PRIMARY KEY,
    content_type text        NOT NULL,
    content      bytea       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz
);
CREATE INDEX claim_checks_expires_at ON claim_checks (expires_at) WHERE expires_at IS NOT NULL;

-- Guarded side effects: calls to the outside world (charge a card, send an email) made
-- once per key, their outcome recorded so a retry, redelivery or replay reuses it.
CREATE TABLE side_effects (
    key          text        PRIMARY KEY,
    state        text        NOT NULL CHECK (state IN ('pending', 'in_progress', 'succeeded', 'failed')),
    owner        uuid,
    lease_until  timestamptz,
    attempts     integer     NOT NULL DEFAULT 0,
    takeovers    integer     NOT NULL DEFAULT 0,
    result       jsonb,
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX side_effects_in_progress ON side_effects (lease_until) WHERE state = 'in_progress';

-- Steps a participant has compensated: a forward command for one of them is refused.
CREATE TABLE closed_steps (
    step_key  text        PRIMARY KEY,
    consumer  text        NOT NULL,
    closed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX closed_steps_closed_at ON closed_steps USING brin (closed_at);

-- What a participant answered to each message it handled: a duplicate is answered again.
CREATE TABLE inbox_replies (
    consumer     text        NOT NULL,
    message_id   uuid        NOT NULL,
    reply_id     uuid        NOT NULL,
    destination  text        NOT NULL,
    message_type text        NOT NULL,
    saga_id      uuid,
    body         bytea       NOT NULL,
    sent_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id, reply_id)
);
CREATE INDEX inbox_replies_sent_at ON inbox_replies USING brin (sent_at);

-- The dashboard's saga list: newest first, keyset pages (with or without a status filter).
CREATE INDEX saga_instances_started ON saga_instances (started_at, id);
CREATE INDEX saga_instances_status_started ON saga_instances (status, started_at, id);
CREATE INDEX dead_letters_saga ON dead_letters (saga_id) WHERE saga_id IS NOT NULL;
CREATE INDEX inbox_replies_saga ON inbox_replies (saga_id) WHERE saga_id IS NOT NULL;

-- Every action taken from the dashboard: who, when, what, and how it ended.
CREATE TABLE dashboard_actions (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    acted_at  timestamptz NOT NULL DEFAULT now(),
    operator  text        NOT NULL,
    client    text,
    action    text        NOT NULL CHECK (action IN ('replay', 'purge', 'cancel', 'resume')),
    target    jsonb       NOT NULL,
    result    text        NOT NULL
);
CREATE INDEX dashboard_actions_acted_at ON dashboard_actions USING brin (acted_at);

CREATE TABLE saga_definitions (
    name        text        NOT NULL,
    version     integer     NOT NULL,
    fingerprint text        NOT NULL,
    steps       jsonb       NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

-- Events: what each consumer subscribes to (recorded at every connect), events that
-- reached no subscriber, and events kept for the saga that will wait for them.
CREATE TABLE subscriptions (
    consumer          text        NOT NULL,
    message_type      text        NOT NULL,
    broker            text        NOT NULL,
    queue             text        NOT NULL,
    first_declared_at timestamptz NOT NULL DEFAULT now(),
    last_declared_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_type, broker, queue)
);
CREATE TABLE events_unrouted (
    message_type text        PRIMARY KEY,
    events       bigint      NOT NULL,
    first_at     timestamptz NOT NULL DEFAULT now(),
    last_at      timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE early_events (
    message_type    text        NOT NULL,
    correlation_key text        NOT NULL,
    message_id      uuid        NOT NULL,
    payload         jsonb       NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_type, correlation_key, message_id)
);
CREATE INDEX early_events_received_at ON early_events USING brin (received_at);

-- A delivery's opening in one statement (see 0017_lone_delivery.sql): the closed steps
-- among ``keys``, read in a fresh snapshot after their shared step-key locks are granted.
CREATE FUNCTION closed_steps_locked(keys text[], seed bigint) RETURNS SETOF text
LANGUAGE sql VOLATILE
BEGIN ATOMIC
    SELECT count(pg_advisory_xact_lock_shared(hashtextextended(k, seed)))
    FROM (SELECT DISTINCT unnest(keys) AS k ORDER BY 1) AS ordered;
    SELECT step_key FROM closed_steps WHERE step_key = ANY(keys);
END;
