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
