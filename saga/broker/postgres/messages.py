"""The PostgreSQL broker's messages table: its definition (a ring of generations, see
:mod:`saga.broker.postgres.rotation`), and the claim that takes the oldest visible
messages of some queues under a lease."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

#: Partitions of the messages table, one per generation, used in a ring.
GENERATIONS = 3

#: Formatted with ``schema``, ``table``, ``ring`` and ``index`` identifiers. The ring's one
#: row names the generation publishers write to; an INSERT that does not name a
#: generation gets that one (the publishers' statements name it, read once per statement).
MESSAGES_DDL = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {ring} (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    generation smallint NOT NULL DEFAULT 0,
    switched_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {ring} DEFAULT VALUES ON CONFLICT DO NOTHING;
CREATE OR REPLACE FUNCTION {current_generation}() RETURNS smallint
    LANGUAGE sql STABLE AS {current_generation_body};
CREATE TABLE IF NOT EXISTS {table} (
    id bigint GENERATED ALWAYS AS IDENTITY,
    generation smallint NOT NULL DEFAULT {current_generation}(),
    queue text NOT NULL,
    body bytea NOT NULL,
    headers jsonb NOT NULL DEFAULT '{{}}',
    properties jsonb NOT NULL DEFAULT '{{}}',
    visible_at timestamptz NOT NULL DEFAULT now(),
    lock_token uuid,
    attempts integer NOT NULL DEFAULT 0,
    enqueued_at timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (generation);
"""

#: Each generation's partition has its own primary key on ``id`` alone (the table's would
#: have to include ``generation``, and an index on ``(id, generation)`` does not tell the
#: planner that an id is found once: before a partition is analyzed it expects a fenced
#: ack's ``id = ANY(...)`` of a hundred ids to match half the partition, and scans it).
#: Ids stay unique across the table: they come from its identity, and a message the
#: rotation moves leaves its partition as it enters the next.
_PARTITION_DDL = (
    "CREATE TABLE IF NOT EXISTS {partition} PARTITION OF {table} (PRIMARY KEY (id)) "
    "FOR VALUES IN ({n})"
)
_INDEX_DDL = "CREATE INDEX IF NOT EXISTS {index} ON {table} (queue, visible_at, id)"

#: The columns a message keeps when it changes tables.
_COLUMNS = "id, queue, body, headers, properties, visible_at, lock_token, attempts, enqueued_at"

#: A table of the first layout (one unpartitioned table), renamed away before the ring is
#: made, its messages copied into it, then dropped.
_UNPARTITIONED = "messages_unpartitioned"


def partition(schema: str, generation: int) -> sql.Identifier:
    """The table of one generation."""
    return sql.Identifier(schema, f"messages_{generation}")


def layout_is_current(db: psycopg.Connection[Any], schema: str) -> bool:
    """Whether ``schema`` has the messages table of this version: a ring whose partitions
    have their own keys (the table none)."""
    row = db.execute(
        "SELECT relkind = 'p' AND NOT EXISTS "
        "(SELECT FROM pg_constraint WHERE conrelid = c.oid AND contype = 'p') "
        "FROM pg_class c WHERE c.oid = to_regclass(%s)",
        (f"{schema}.messages",),
    ).fetchone()
    return row is not None and bool(row[0])


def create_messages(db: psycopg.Connection[Any], schema: str) -> None:
    """Create the messages table of ``schema`` (inside the caller's transaction, under its
    lock), moving the messages of a table of the first, unpartitioned layout into it, and
    giving the partitions of a ring keyed on ``(id, generation)`` keys of their own."""
    table = sql.Identifier(schema, "messages")
    row = db.execute(
        "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", (f"{schema}.messages",)
    ).fetchone()
    unpartitioned = row is not None and row[0] == "r"
    if row is not None and row[0] == "p" and not layout_is_current(db, schema):
        db.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT messages_pkey").format(table))
        for n in range(GENERATIONS):
            db.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(partition(schema, n)))
    if unpartitioned:
        old = sql.Identifier(schema, _UNPARTITIONED)
        db.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table))
        db.execute(
            sql.SQL("ALTER TABLE {} RENAME TO {}").format(table, sql.Identifier(_UNPARTITIONED))
        )
        db.execute(
            sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                sql.Identifier(schema, "messages_ready"), sql.Identifier(f"{_UNPARTITIONED}_ready")
            )
        )
    ring = sql.Identifier(schema, "ring")
    db.execute(
        sql.SQL(MESSAGES_DDL).format(
            schema=sql.Identifier(schema),
            table=table,
            ring=ring,
            current_generation_body=sql.Literal(f'SELECT generation FROM "{schema}".ring'),
            current_generation=sql.Identifier(schema, "current_generation"),
        )
    )
    for n in range(GENERATIONS):
        db.execute(sql.SQL(_PARTITION_DDL).format(partition=partition(schema, n), table=table, n=n))
    db.execute(sql.SQL(_INDEX_DDL).format(index=sql.Identifier("messages_ready"), table=table))
    if unpartitioned:
        columns = sql.SQL(_COLUMNS)
        db.execute(
            sql.SQL("INSERT INTO {t} ({c}) OVERRIDING SYSTEM VALUE SELECT {c} FROM {old}").format(
                t=table, c=columns, old=old
            )
        )
        db.execute(
            sql.SQL(
                "SELECT setval(pg_get_serial_sequence(%s, 'id'), "
                "(SELECT coalesce(max(id), 0) + 1 FROM {}), false)"
            ).format(old),
            (f'"{schema}".messages',),
        )
        db.execute(sql.SQL("DROP TABLE {}").format(old))


def claim_statement(schema: str) -> sql.Composed:
    """Take the oldest visible messages of some queues under a lease (parameters:
    :func:`claim_parameters`). Returns the messages taken, each with the ``visible_at`` it
    had and its generation, and one last row whose only value is the statement's ``now()``.

    Per queue, one index scan per generation's partition, each walking ``(queue,
    visible_at, id)`` in order from the queue's floor (:mod:`saga.broker.postgres.low_water`)
    and stopping at the limit; the oldest of those (at most a limit per generation) are
    taken. With ``queue = ANY(...)``, or one scan of the partitioned table, PostgreSQL may
    sort every visible message instead (it does whenever its estimates of the partitions
    are off, as they are while a backlog is growing), and a claim's cost would grow with
    the backlog; from the queue's start, it would grow with the messages consumed since
    the oldest snapshot still held.
    """
    scans = sql.SQL(" UNION ALL ").join(
        sql.SQL(  # each in a subquery of its own: FOR UPDATE is refused in a UNION's arms
            "SELECT * FROM (SELECT id, generation, visible_at FROM {p} WHERE queue = w.queue "
            "AND visible_at >= coalesce(w.floor, '-infinity') AND visible_at <= now() "
            "ORDER BY visible_at, id LIMIT %s FOR UPDATE SKIP LOCKED) AS {g}"
        ).format(p=partition(schema, generation), g=sql.Identifier(f"g{generation}"))
        for generation in range(GENERATIONS)
    )
    return sql.SQL(
        "WITH next AS (SELECT c.id, c.generation, c.visible_at FROM "
        "unnest(%b::text[], %b::timestamptz[]) AS w(queue, floor), LATERAL ({scans}) AS c "
        "ORDER BY c.visible_at, c.id LIMIT %s), "
        "taken AS (UPDATE {t} m SET visible_at = now() + %s * interval '1 second', "
        "lock_token = %s, attempts = m.attempts + 1 FROM next "
        "WHERE m.id = next.id AND m.generation = next.generation "
        "RETURNING m.id, m.queue, m.body, m.headers, m.properties, m.attempts, "
        "next.visible_at, m.generation) "
        "SELECT *, NULL::timestamptz FROM taken "
        "UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, now()"
    ).format(scans=scans, t=sql.Identifier(schema, "messages"))


def claim_parameters(
    queues: Sequence[str],
    floors: Sequence[datetime | None],
    limit: int,
    lease: float,
    token: uuid.UUID,
) -> tuple[Any, ...]:
    """The parameters of :func:`claim_statement`, in its order."""
    return (list(queues), list(floors), *[limit] * GENERATIONS, limit, lease, token)
