"""The relay's SQL: lease ready rows, settle what was published, defer or quarantine the rest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

from saga.db.sql import Tx, render
from saga.errors import UnsafeDurability
from saga.messaging.events import EventRecords

#: The ready rows a sweep from a floor takes first, locked, skipping rows other relays hold.
_READY = """
SELECT id FROM {schema}.outbox
WHERE deliver_after IS NULL AND id >= %s
ORDER BY id
LIMIT %s
FOR UPDATE SKIP LOCKED
"""

#: A statement that only leases rows, or removes rows the broker has taken, need not wait
#: for the disk at its commit: a crash that forgets it brings the rows back, they are
#: published again and consumers deduplicate. Set inside the statement, so it costs no
#: round trip.
_ASYNC_COMMIT = "(SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL"

#: Lease ready rows to this relay: one statement, a transaction of its own. A leased row
#: waits for nothing (its ``deliver_after`` is the lease's end): no other relay takes it
#: while the lease runs, and once it lapses (the relay died) it is ready again.
_LEASE = f"""
UPDATE {{schema}}.outbox SET deliver_after = now() + %s::interval, leased = true
WHERE id IN ({_READY}) AND {_ASYNC_COMMIT}
RETURNING id, message_id, destination, message_type, body, attempts
"""

#: The id the outbox's sequence gives next (USAGE on the sequence suffices).
_NEXT_ID = "coalesce(pg_sequence_last_value(pg_get_serial_sequence(%s, 'id')), 0) + 1"

#: Whether a sweep from a floor would find anything: the first ready id from it (locked by
#: another relay or not) and the id the sequence gives next. One statement, outside any
#: transaction: a poll that finds nothing costs one round trip, and no BEGIN or COMMIT.
_PROBE = f"""
SELECT (SELECT id FROM {{schema}}.outbox WHERE deliver_after IS NULL AND id >= %s
        ORDER BY id LIMIT 1),
       {_NEXT_ID}
"""

_DELETE = "DELETE FROM {schema}.outbox WHERE id = ANY(%b::bigint[])"

#: A consumer (saga.messaging.leases) or a relay gives up the rows leased to it that it
#: could not publish: ready for the relays at once rather than when the lease ends.
_RELEASE = """
UPDATE {schema}.outbox SET deliver_after = NULL
WHERE id = ANY(%b::bigint[]) AND deliver_after IS NOT NULL
"""

_DEFER = """
UPDATE {schema}.outbox
SET attempts = attempts + 1, last_error = %s, deliver_after = now() + %s::interval,
    leased = false
WHERE id = %s
"""

_QUARANTINE = """
WITH moved AS (
    DELETE FROM {schema}.outbox WHERE id = %s
    RETURNING message_id, message_type, saga_id, destination, body, attempts, created_at
)
INSERT INTO {schema}.dead_letters
    (consumer, reason, message_id, message_type, saga_id, destination, content_type, body,
     error_type, error_message, attempts, first_failed_at)
SELECT 'outbox_relay', 'unpublishable', message_id, message_type, saga_id, destination,
       'application/json', body, %s, %s, attempts + 1, created_at
FROM moved
"""

_PROMOTE_DUE = """
UPDATE {schema}.outbox SET deliver_after = NULL
WHERE id IN (
    SELECT id FROM {schema}.outbox
    WHERE deliver_after <= now()
    ORDER BY deliver_after
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
"""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One outbox row leased to a relay."""

    id: int
    message_id: UUID
    destination: str | None  # None: an event, for every subscriber of its type
    message_type: str
    body: bytes
    attempts: int


class RelayStore:
    """Statements on one schema's outbox, run on a connection the caller manages."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._lease = render(_LEASE, schema)
        self._probe = render(_PROBE, schema)
        self._outbox = f"{schema}.outbox"
        self._delete = render(_DELETE, schema)
        self._events = EventRecords(schema)
        self._defer = render(_DEFER, schema)
        self._release = render(_RELEASE, schema)
        self._quarantine = render(_QUARANTINE, schema)
        self._promote = render(_PROMOTE_DUE, schema)

    def lease(self, conn: Tx, limit: int, lease: timedelta, floor: int = 0) -> list[OutboxRow]:
        """Lease up to ``limit`` ready rows from id ``floor`` on for ``lease``, skipping rows
        other relays hold (:mod:`outbox_relay.sweep_floor` says why a floor); in id order.
        On an autocommit connection, a transaction of its own."""
        rows = conn.execute(self._lease, (lease, floor, limit), prepare=True).fetchall()
        leased = [OutboxRow(r[0], r[1], r[2], r[3], bytes(r[4]), r[5]) for r in rows]
        return sorted(leased, key=lambda row: row.id)

    def probe(self, conn: Tx, floor: int) -> tuple[int | None, int]:
        """The first ready row's id from ``floor`` on (None: none is ready) and the id the
        outbox's next row will get (ids below it are taken); on an autocommit connection,
        a statement of its own."""
        row = conn.execute(self._probe, (floor, self._outbox), prepare=True).fetchone()
        assert row is not None
        return (None if row[0] is None else int(row[0])), int(row[1])

    def settling(
        self, published: Sequence[int], unrouted: Sequence[str]
    ) -> tuple[list[str], list[Any]]:
        """Writable CTEs (and their parameters) that delete the ``published`` rows and count
        the ``unrouted`` events among them: parts of a larger statement (a consumer's
        closing one) or of :meth:`settle`."""
        ctes: list[str] = []
        params: list[Any] = []
        if published:
            ctes.append(f"gone AS ({self._delete})")
            params.append(list(published))
        if unrouted:
            query, values = self._events.unrouted_counted(unrouted)
            ctes.append(f"counted AS ({query})")
            params += values
        return ctes, params

    def settle(self, conn: Tx, published: Sequence[int], unrouted: Sequence[str]) -> None:
        """Delete the ``published`` rows and count the ``unrouted`` events among them in one
        statement (on an autocommit connection, a transaction of its own), whose commit does
        not wait for the disk."""
        ctes, params = self.settling(published, unrouted)
        if ctes:
            statement = "WITH " + ",\n".join(ctes) + f"\nSELECT {_ASYNC_COMMIT}"
            conn.execute(statement, params, prepare=True)

    def release(self, tx: Tx, ids: list[int]) -> None:
        """Make rows leased to a consumer or a relay ready for the relays now."""
        if ids:
            tx.execute(self._release, (ids,))

    def defer(self, tx: Tx, row_id: int, error: str, delay: timedelta) -> None:
        """Record a failed publish and hold the row back for ``delay``."""
        tx.execute(self._defer, (error, delay, row_id))

    def quarantine(self, tx: Tx, row_id: int, error_type: str, error: str) -> None:
        """Move a row that cannot be published to the dead letters, with its reason."""
        tx.execute(self._quarantine, (row_id, error_type, error))

    def promote_due(self, tx: Tx, limit: int = 1000) -> int:
        """Make scheduled rows whose time has come ready to lease; return how many."""
        cur = tx.execute(self._promote, (limit,), prepare=True)
        return cur.rowcount


def check_durability(tx: Tx, *, allow_async_commit: bool) -> None:
    """Refuse to relay when commits on this server may be lost in a crash.

    With ``synchronous_commit = off`` a writer's commit returns before it is
    on disk: the relay could publish a message that a crash then erases.
    """
    row = tx.execute("SELECT current_setting('synchronous_commit')").fetchone()
    setting = row[0] if row else "on"
    if setting == "off" and not allow_async_commit:
        raise UnsafeDurability(
            "synchronous_commit is off for this database/role: a crash could erase rows the "
            "relay already published. Turn it on (ALTER DATABASE ... SET synchronous_commit = on) "
            "or pass --allow-async-commit if you accept that risk."
        )
