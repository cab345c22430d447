"""The PostgreSQL broker's messages table: its definition, and the claim that takes the
oldest visible messages of some queues under a lease."""

from __future__ import annotations

from psycopg import sql

#: Formatted with ``schema``, ``table`` and ``index`` identifiers.
MESSAGES_DDL = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {table} (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    body bytea NOT NULL,
    headers jsonb NOT NULL DEFAULT '{{}}',
    properties jsonb NOT NULL DEFAULT '{{}}',
    visible_at timestamptz NOT NULL DEFAULT now(),
    lock_token uuid,
    attempts integer NOT NULL DEFAULT 0,
    enqueued_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (queue, visible_at, id);
"""


def claim_statement(table: sql.Identifier) -> sql.Composed:
    """Take the oldest visible messages of some queues under a lease (parameters: the
    queues, each one's floor or NULL, the limit twice, the lease in seconds, the lock
    token). Returns the messages taken, each with the ``visible_at`` it had, and one last
    row whose only value is the statement's ``now()``.

    One index scan per queue, each walking ``(queue, visible_at, id)`` in order from the
    queue's floor (:mod:`saga.broker.postgres.low_water`) and stopping at the limit: with
    ``queue = ANY(...)`` PostgreSQL cannot use the index's order and sorts every visible
    message, so a claim's cost would grow with the backlog; from the queue's start, it
    would grow with the messages consumed since the oldest snapshot still held.
    """
    return sql.SQL(
        "WITH next AS (SELECT c.id, c.visible_at FROM "
        "unnest(%b::text[], %b::timestamptz[]) AS w(queue, floor), LATERAL "
        "(SELECT id, visible_at FROM {t} WHERE queue = w.queue "
        "AND visible_at >= coalesce(w.floor, '-infinity') AND visible_at <= now() "
        "ORDER BY visible_at, id LIMIT %s FOR UPDATE SKIP LOCKED) AS c "
        "ORDER BY c.visible_at, c.id LIMIT %s), "
        "taken AS (UPDATE {t} m SET visible_at = now() + %s * interval '1 second', "
        "lock_token = %s, attempts = m.attempts + 1 FROM next WHERE m.id = next.id "
        "RETURNING m.id, m.queue, m.body, m.headers, m.properties, m.attempts, "
        "next.visible_at) "
        "SELECT *, NULL::timestamptz FROM taken "
        "UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, now()"
    ).format(t=table)
