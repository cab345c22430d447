-- Surrogate keys, no unique business ids: a duplicate effect would show as a second row.
CREATE TABLE IF NOT EXISTS credit (
    customer_id text PRIMARY KEY,
    initial     bigint NOT NULL,
    available   bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS credit_reservations (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           text    NOT NULL,
    order_id     text    NOT NULL,
    customer_id  text    NOT NULL,
    amount_cents integer NOT NULL,
    status       text    NOT NULL
);
CREATE INDEX IF NOT EXISTS credit_reservations_id ON credit_reservations (id);
