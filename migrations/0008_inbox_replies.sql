-- Replies kept with the inbox: what a participant answered to each message it handled.
-- A duplicate of that message (a saga resumed after a broker lost the reply) is answered
-- again with the same replies, under the same message ids, so the saga can go on and its
-- own inbox makes a second copy harmless. Pruned with the inbox (the same window).

CREATE TABLE inbox_replies (
    consumer     text        NOT NULL,
    message_id   uuid        NOT NULL,
    reply_id     uuid        NOT NULL,
    destination  text        NOT NULL,
    message_type text        NOT NULL,
    saga_id      uuid,
    body         bytea       NOT NULL,
    sent_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id, reply_id)
);
CREATE INDEX inbox_replies_sent_at ON inbox_replies USING brin (sent_at);
