-- Running totals of approved orders per customer.
CREATE TABLE IF NOT EXISTS approved_totals (
    customer_id  text   PRIMARY KEY,
    orders       bigint NOT NULL,
    amount_cents bigint NOT NULL
);
