-- Events (publish/subscribe): an outbox row with no destination is an event, published
-- to every service that subscribes to its type. A subscriber records the subscriptions it
-- declared; a relay counts the events it published that no subscriber received; a saga
-- waits for an event correlated by a key, and an event that comes before its saga waits
-- is kept until the saga does.

ALTER TABLE outbox ALTER COLUMN destination DROP NOT NULL;

-- What each consumer service of this database subscribes to, on which broker and queue:
-- written by the consumer every time it connects and declares its bindings.
CREATE TABLE subscriptions (
    consumer          text        NOT NULL,
    message_type      text        NOT NULL,
    broker            text        NOT NULL,
    queue             text        NOT NULL,
    first_declared_at timestamptz NOT NULL DEFAULT now(),
    last_declared_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_type, broker, queue)
);

-- Events this database's relays (and consumers publishing their own rows) published that
-- reached no subscriber: not an error, but worth seeing (`saga stats`).
CREATE TABLE events_unrouted (
    message_type text        PRIMARY KEY,
    events       bigint      NOT NULL,
    first_at     timestamptz NOT NULL DEFAULT now(),
    last_at      timestamptz NOT NULL DEFAULT now()
);

-- A saga waiting for an event keeps the key it waits under.
ALTER TABLE saga_instances ADD COLUMN wait_key text;
CREATE INDEX saga_instances_wait_key
    ON saga_instances (waiting_for, wait_key) WHERE wait_key IS NOT NULL;

-- Events that came before any saga waited for them, kept for the saga that will.
CREATE TABLE early_events (
    message_type    text        NOT NULL,
    correlation_key text        NOT NULL,
    message_id      uuid        NOT NULL,
    payload         jsonb       NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_type, correlation_key, message_id)
);
CREATE INDEX early_events_received_at ON early_events USING brin (received_at);
