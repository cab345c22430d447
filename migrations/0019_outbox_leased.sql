-- A row a consumer wrote under a lease (published by that consumer right after its
-- commit, see saga.messaging.leases) says so. While its lease runs it waits for nothing:
-- the dashboard does not list it as waiting in the outbox, nor count it as scheduled.
-- Once the lease has lapsed, or the consumer handed it back (deliver_after NULL), it
-- waits for the relays like any other row. Adding a column with a constant default
-- rewrites nothing.
ALTER TABLE outbox ADD COLUMN leased boolean NOT NULL DEFAULT false;
