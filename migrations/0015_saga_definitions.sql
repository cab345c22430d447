-- The shape of each saga definition version (its steps: names, order, kinds, pivot,
-- compensations, replies, events), recorded when a consumer of its registry connects.
-- A later start whose definition differs under the same version, while sagas of that
-- version are unfinished, is refused: they are stored by step name and would be stranded.
CREATE TABLE saga_definitions (
    name        text        NOT NULL,
    version     integer     NOT NULL,
    fingerprint text        NOT NULL,
    steps       jsonb       NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);
