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
    queues, the limit twice, the lease in seconds, the lock token).

    One index scan per queue, each walking ``(queue, visible_at, id)`` in order and
    stopping at the limit: with ``queue = ANY(...)`` PostgreSQL cannot use the index's
    order and sorts every visible message, so a claim's cost would grow with the backlog.
    """
    return sql.SQL(
        "WITH next AS (SELECT c.id FROM unnest(%b::text[]) AS w(queue), LATERAL "
        "(SELECT id, visible_at FROM {t} WHERE queue = w.queue AND visible_at <= now() "
        "ORDER BY visible_at, id LIMIT %s FOR UPDATE SKIP LOCKED) AS c "
        "ORDER BY c.visible_at, c.id LIMIT %s) "
        "UPDATE {t} m SET visible_at = now() + %s * interval '1 second', "
        "lock_token = %s, attempts = m.attempts + 1 FROM next WHERE m.id = next.id "
        "RETURNING m.id, m.queue, m.body, m.headers, m.properties, m.attempts"
    ).format(t=table)
