CREATE TABLE IF NOT EXISTS stock (
    sku       text PRIMARY KEY,
    initial   integer NOT NULL,
    available integer NOT NULL
);
CREATE TABLE IF NOT EXISTS stock_reservations (
    seq      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id       text    NOT NULL,
    order_id text    NOT NULL,
    sku      text    NOT NULL,
    quantity integer NOT NULL,
    status   text    NOT NULL
);
CREATE INDEX IF NOT EXISTS stock_reservations_id ON stock_reservations (id);
CREATE INDEX IF NOT EXISTS stock_reservations_order ON stock_reservations (order_id);
CREATE TABLE IF NOT EXISTS shipments (
    seq            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id             text NOT NULL,
    order_id       text NOT NULL,
    reservation_id text,  -- NULL: every reservation of the order (one per line)
    region         text NOT NULL
);
CREATE TABLE IF NOT EXISTS closed_regions (region text PRIMARY KEY);
-- a database made before orders had lines
ALTER TABLE shipments ALTER COLUMN reservation_id DROP NOT NULL;
