-- One row per notice sent, no unique key: a notice sent twice would show as a second row.
CREATE TABLE IF NOT EXISTS notices (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id    text        NOT NULL,
    customer_id text        NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('approved', 'rejected')),
    sent_at     timestamptz NOT NULL DEFAULT now()
);
