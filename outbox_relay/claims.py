"""The relay's SQL: claim ready rows, delete what was published, defer or quarantine the rest."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from saga.db.sql import Tx, render
from saga.errors import UnsafeDurability

_CLAIM = """
SELECT id, message_id, destination, message_type, body, attempts
FROM {schema}.outbox
WHERE deliver_after IS NULL AND id >= %s
ORDER BY id
LIMIT %s
FOR UPDATE SKIP LOCKED
"""

#: A transaction that only removes rows the broker has taken need not wait for the disk
#: at its commit: a crash that forgets it brings the rows back, they are published again
#: and consumers deduplicate. Set inside the statement, so it costs no round trip.
_ASYNC_COMMIT = "(SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL"

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

_DELETE = f"DELETE FROM {{schema}}.outbox WHERE id = ANY(%b::bigint[]) AND {_ASYNC_COMMIT}"

#: A consumer gives up the rows leased to it (saga.messaging.leases) that it could not
#: publish: ready for the relays at once rather than when the lease ends.
_RELEASE = """
UPDATE {schema}.outbox SET deliver_after = NULL
WHERE id = ANY(%b::bigint[]) AND deliver_after IS NOT NULL
"""

_DEFER = """
UPDATE {schema}.outbox
SET attempts = attempts + 1, last_error = %s, deliver_after = now() + %s::interval
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
    """One claimed outbox row."""

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
        self._claim = render(_CLAIM, schema)
        self._probe = render(_PROBE, schema)
        self._outbox = f"{schema}.outbox"
        self._delete = render(_DELETE, schema)
        self._defer = render(_DEFER, schema)
        self._release = render(_RELEASE, schema)
        self._quarantine = render(_QUARANTINE, schema)
        self._promote = render(_PROMOTE_DUE, schema)

    def claim(self, tx: Tx, limit: int, floor: int = 0) -> list[OutboxRow]:
        """Lock up to ``limit`` ready rows from id ``floor`` on, in id order, skipping rows
        other relays hold (:mod:`outbox_relay.sweep_floor` says why a floor)."""
        rows = tx.execute(self._claim, (floor, limit), prepare=True).fetchall()
        return [OutboxRow(r[0], r[1], r[2], r[3], bytes(r[4]), r[5]) for r in rows]

    def probe(self, conn: Tx, floor: int) -> tuple[int | None, int]:
        """The first ready row's id from ``floor`` on (None: none is ready) and the id the
        outbox's next row will get (ids below it are taken); on an autocommit connection,
        a statement of its own."""
        row = conn.execute(self._probe, (floor, self._outbox), prepare=True).fetchone()
        assert row is not None
        return (None if row[0] is None else int(row[0])), int(row[1])

    def delete(self, tx: Tx, ids: list[int]) -> None:
        """Delete published rows; the transaction's commit then does not wait for the disk."""
        if ids:
            tx.execute(self._delete, (ids,), prepare=True)

    def release(self, tx: Tx, ids: list[int]) -> None:
        """Make rows leased to a consumer ready for the relays now."""
        if ids:
            tx.execute(self._release, (ids,))

    def defer(self, tx: Tx, row_id: int, error: str, delay: timedelta) -> None:
        """Record a failed publish and hold the row back for ``delay``."""
        tx.execute(self._defer, (error, delay, row_id))

    def quarantine(self, tx: Tx, row_id: int, error_type: str, error: str) -> None:
        """Move a row that cannot be published to the dead letters, with its reason."""
        tx.execute(self._quarantine, (row_id, error_type, error))

    def promote_due(self, tx: Tx, limit: int = 1000) -> int:
        """Make scheduled rows whose time has come ready to claim; return how many."""
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
