-- The declared schema: what applying every numbered migration must produce.
-- Read this file to see the current tables; change it together with a new migration.
-- Runs with search_path set to the framework's schema.

CREATE TABLE outbox (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id    uuid        NOT NULL,
    destination   text        NOT NULL,
    message_type  text        NOT NULL,
    saga_id       uuid,
    body          bytea       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    deliver_after timestamptz,
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text
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
    last_failed_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_consumer ON dead_letters (consumer, last_failed_at);
CREATE INDEX dead_letters_error_type ON dead_letters (error_type, last_failed_at);
CREATE INDEX dead_letters_message_id ON dead_letters (message_id);
