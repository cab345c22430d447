-- Let a saga's step-by-step updates be HOT (heap-only): no index may cover a column
-- that changes on every step. updated_at did; stuck-saga queries filter on it instead.

DROP INDEX saga_instances_unfinished;
CREATE INDEX saga_instances_unfinished ON saga_instances (status) WHERE finished_at IS NULL;
