"""Sagas waiting for published events, found by key; events that came before their saga.

A saga waiting for a published event is a row with ``waiting_for`` (the event's type) and
``wait_key``. An event for which no saga waits yet is kept in ``early_events`` under each
key it carries, and the first saga that begins to wait under one takes it. Both sides take
a transaction-level advisory lock on (type, key) first, so an event and a saga that begins
to wait for it, committing at the same moment, cannot miss each other: whichever comes
second sees what the first committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from saga.db.sql import Tx, render

_LOCK = """
SELECT pg_advisory_xact_lock(hashtextextended('saga event ' || %s || ' ' || k, 0))
FROM unnest(%s::text[]) AS k
"""

_WAITING = """
SELECT id FROM {schema}.saga_instances
WHERE waiting_for = %s AND wait_key = ANY(%s) AND status = 'running'
ORDER BY id
"""

_PARK = """
INSERT INTO {schema}.early_events (message_type, correlation_key, message_id, payload)
SELECT %s, unnest(%s::text[]), %s, %s
ON CONFLICT DO NOTHING
"""

_TAKE = """
DELETE FROM {schema}.early_events WHERE (message_type, correlation_key, message_id) IN (
    SELECT message_type, correlation_key, message_id FROM {schema}.early_events
    WHERE message_type = %s AND correlation_key = %s
    ORDER BY received_at, message_id LIMIT 1
)
RETURNING message_id, payload
"""


@dataclass(frozen=True, slots=True)
class EarlyEvent:
    """An event kept for the saga that will wait for it."""

    message_id: UUID
    payload: dict[str, Any]


class EventWaits:
    """The statements of event waits on one schema, in the caller's transaction."""

    def __init__(self, schema: str) -> None:
        self._waiting = render(_WAITING, schema)
        self._park = render(_PARK, schema)
        self._take = render(_TAKE, schema)

    def lock(self, tx: Tx, event_type: str, keys: Sequence[str]) -> None:
        """Serialize with every transaction about these keys until this one ends (taken in
        sorted order, so two transactions about the same keys never deadlock)."""
        tx.execute(_LOCK, (event_type, sorted(keys)), prepare=True)

    def waiting(self, tx: Tx, event_type: str, keys: Sequence[str]) -> list[UUID]:
        """The running sagas waiting for ``event_type`` under one of ``keys``."""
        return [row[0] for row in tx.execute(self._waiting, (event_type, list(keys)))]

    def park(
        self,
        tx: Tx,
        event_type: str,
        keys: Sequence[str],
        message_id: UUID,
        payload: dict[str, Any],
    ) -> None:
        """Keep an event no saga waits for, under each of its keys."""
        tx.execute(self._park, (event_type, list(keys), message_id, Jsonb(payload)))

    def take(self, tx: Tx, event_type: str, key: str) -> EarlyEvent | None:
        """The oldest event kept for (``event_type``, ``key``), removed; None if there is none."""
        row = tx.execute(self._take, (event_type, key)).fetchone()
        return EarlyEvent(row[0], row[1]) if row else None
