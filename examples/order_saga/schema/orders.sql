CREATE TABLE IF NOT EXISTS orders (
    id           text PRIMARY KEY,
    customer_id  text        NOT NULL,
    amount_cents integer     NOT NULL,
    status       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
