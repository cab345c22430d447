"""The ring of generations that keeps the PostgreSQL broker's table bounded while a
snapshot is held.

A consumed message leaves dead rows behind (its claim, its delete). Vacuum reclaims
them only once no transaction on the database holds a snapshot older than they are: a
report, a ``pg_dump``, a psql window left ``idle in transaction`` keep every message
consumed since they began, and the table grows by the broker's whole throughput.

So the messages table is partitioned by generation (:data:`GENERATIONS` partitions,
used in a ring). Publishers write to the current generation (the ``ring`` table's one
row); claims and lease renewals read all of them, an ack or a release first the
partition its message was taken from. Every :data:`ROTATE_INTERVAL` a pass:

1. empties each generation but the current one that holds a few live messages at most
   (:data:`MOVE_LIMIT`): under an ``ACCESS EXCLUSIVE`` lock on its partition (waited for
   :data:`LOCK_TIMEOUT_MS` at most, else tried again at the next pass, so traffic is
   never held up for longer), its remaining messages (delayed, under a lease, or not yet
   taken) move to the current generation with everything they had (id, lock token,
   ``visible_at``, attempts: a lease's fenced ack and renewal find them there), and the
   partition is ``TRUNCATE``\\ d: its dead rows go at once, whatever snapshot is held;
2. then makes the next generation current, if its partition is empty and the current
   one is :data:`ROTATE_INTERVAL` old.

``TRUNCATE`` needs no vacuum horizon, only the lock: a transaction that read the table
holds a lock on its partitions until it ends, and no partition it read is truncated
meanwhile (the table grows as it did without the ring). One pass at a time, whichever
channel runs it, under an advisory lock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from saga.broker.postgres.messages import GENERATIONS, partition

logger = logging.getLogger(__name__)

#: Seconds a generation stays current; a pass runs this often.
ROTATE_INTERVAL = 5.0
#: A generation holding more live messages than this (a backlog) waits to drain.
MOVE_LIMIT = 10_000
#: How long a pass waits for a partition's lock before leaving it for the next pass.
LOCK_TIMEOUT_MS = 50


@dataclass(frozen=True, slots=True)
class Pass:
    """What one pass did: the generations truncated, the messages moved out of them, and
    the generation current at its end (None: another channel's pass was running)."""

    truncated: tuple[int, ...] = ()
    moved: int = 0
    current: int | None = None


class Rotation:
    """The passes over the ring of one broker schema, on a connection in autocommit."""

    def __init__(self, schema: str, interval: float = ROTATE_INTERVAL) -> None:
        self.schema = schema
        self.interval = interval
        self.table = sql.Identifier(schema, "messages")
        self.ring = sql.Identifier(schema, "ring")
        self._lock_key = f"{schema}.rotation"

    def run(self, db: psycopg.Connection[Any]) -> Pass:
        """One pass: empty the drained generations, then move the current one on."""
        row = db.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (self._lock_key,)).fetchone()
        if not (row and row[0]):
            return Pass()
        try:
            current = self._current(db)
            truncated, moved = [], 0
            for step in range(1, GENERATIONS):
                generation = (current + step) % GENERATIONS
                emptied = self._empty(db, generation, current)
                if emptied is not None:
                    truncated.append(generation)
                    moved += emptied
            return Pass(tuple(truncated), moved, self._switch(db, current))
        finally:
            db.execute("SELECT pg_advisory_unlock(hashtext(%s))", (self._lock_key,))

    def _current(self, db: psycopg.Connection[Any]) -> int:
        row = db.execute(sql.SQL("SELECT generation FROM {}").format(self.ring)).fetchone()
        assert row is not None
        return int(row[0])

    def _size(self, db: psycopg.Connection[Any], generation: int) -> int:
        """The bytes of the partition of ``generation`` (0: truncated, nothing written since)."""
        row = db.execute(
            "SELECT pg_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (self.schema, f"messages_{generation}"),
        ).fetchone()
        assert row is not None
        return int(row[0])

    def _empty(self, db: psycopg.Connection[Any], generation: int, current: int) -> int | None:
        """Move the live messages of ``generation`` to ``current`` and truncate its
        partition; the messages moved, or None if it was empty already or is left for now
        (a backlog, or its lock not had within the timeout)."""
        if self._size(db, generation) == 0:
            return None
        table = partition(self.schema, generation)
        live = db.execute(
            sql.SQL("SELECT count(*) FROM (SELECT FROM {} LIMIT %s) AS live").format(table),
            (MOVE_LIMIT + 1,),
        ).fetchone()
        if live is None or live[0] > MOVE_LIMIT:
            return None
        try:
            with db.transaction():
                db.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(LOCK_TIMEOUT_MS))
                db.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table))
                moved = db.execute(
                    sql.SQL("UPDATE {} SET generation = %s WHERE generation = %s").format(
                        self.table
                    ),
                    (current, generation),
                ).rowcount
                db.execute(sql.SQL("TRUNCATE {}").format(table))
        except psycopg.errors.LockNotAvailable:
            logger.debug(
                "generation %d of %s busy: truncated at a later pass", generation, self.schema
            )
            return None
        return moved

    def _switch(self, db: psycopg.Connection[Any], current: int) -> int:
        """Make the next generation current if it is empty and the current one has had its
        interval; the generation current afterwards."""
        following = (current + 1) % GENERATIONS
        if self._size(db, following) != 0:
            return current
        row = db.execute(
            sql.SQL(
                "UPDATE {} SET generation = %s, switched_at = now() "
                "WHERE generation = %s AND switched_at <= now() - %s * interval '1 second' "
                "RETURNING generation"
            ).format(self.ring),
            (following, current, self.interval),
        ).fetchone()
        return following if row else current
