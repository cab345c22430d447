-- The operators' dashboard (`saga dashboard`): pages over millions of sagas, and a record
-- of every change made from it.

-- Newest first, a page after another: the saga list walks (started_at, id) backwards
-- from the last row shown (keyset pagination), with or without a status filter.
-- Neither column set changes on a step, so step updates stay HOT.
CREATE INDEX saga_instances_started ON saga_instances (started_at, id);
CREATE INDEX saga_instances_status_started ON saga_instances (status, started_at, id);

-- A saga's page gathers its dead letters and the replies its participants sent.
CREATE INDEX dead_letters_saga ON dead_letters (saga_id) WHERE saga_id IS NOT NULL;
CREATE INDEX inbox_replies_saga ON inbox_replies (saga_id) WHERE saga_id IS NOT NULL;

-- One row per action taken from the dashboard (replay, purge, cancel, resume): who, when,
-- what, and how it ended.
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
