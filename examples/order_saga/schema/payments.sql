CREATE TABLE IF NOT EXISTS charges (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           text    NOT NULL,
    order_id     text    NOT NULL,
    amount_cents integer NOT NULL,
    status       text    NOT NULL,
    gateway_id   text
);
CREATE INDEX IF NOT EXISTS charges_id ON charges (id);
CREATE TABLE IF NOT EXISTS refunds (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    charge_id    text    NOT NULL,
    order_id     text    NOT NULL,
    amount_cents integer NOT NULL
);
