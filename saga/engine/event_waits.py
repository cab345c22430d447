"""Sagas waiting for published events, found by key; events that came before their saga.

:class:`EventDelivery` is the orchestrator's part: it hands a published event to every
saga waiting for it under a key it carries (as a signal: the transition is the same),
keeps it under the keys nobody waited for, and when a saga begins such a wait gives it
the event that came early. :class:`EventWaits` holds their statements.

A saga waiting for a published event is a row with ``waiting_for`` (the event's type) and
``wait_key``. An event for which no saga waits yet is kept in ``early_events`` under each
key it carries, and the first saga that begins to wait under one takes it (the oldest
first; one the saga refuses is dropped, as it would be had it come during the wait, and
the next is offered, until the wait ends or none is left). Both sides take
a transaction-level advisory lock on (type, key) first, so an event and a saga that begins
to wait for it, committing at the same moment, cannot miss each other: whichever comes
second sees what the first committed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg.rows import class_row
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from saga.db.sql import Tx, render
from saga.engine.definition import Saga, WaitStep
from saga.engine.staged_writes import StagedSagaWrites
from saga.engine.staleness import awaits_event
from saga.engine.state import SagaRecord
from saga.messaging.control import Signal
from saga.messaging.envelope import Envelope
from saga.observability.metrics import Metrics

#: The orchestrator's: a saga's record (from the batch's read when there is one) ...
ReadRecord = Callable[[Tx, UUID, StagedSagaWrites | None], SagaRecord | None]
#: ... the definition it runs under, and how a signal is applied to it: True, or False
#: when the saga refused it (then the saga is unchanged).
DefinitionOf = Callable[[SagaRecord], Saga[Any]]
ApplySignal = Callable[[Tx, SagaRecord, Signal, str, Metrics | None, StagedSagaWrites | None], bool]

_LOCK = """
SELECT pg_advisory_xact_lock(hashtextextended('saga event ' || %s || ' ' || k, 0))
FROM unnest(%b::text[]) AS k
"""

_WAITING = """
SELECT id FROM {schema}.saga_instances
WHERE waiting_for = %s AND wait_key = ANY(%b::text[]) AND status = 'running'
ORDER BY id
"""

_PARK = """
INSERT INTO {schema}.early_events (message_type, correlation_key, message_id, payload)
SELECT %s, unnest(%b::text[]), %s, %s
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
        cur = tx.cursor(row_factory=class_row(EarlyEvent))
        return cur.execute(self._take, (event_type, key)).fetchone()


class EventDelivery:
    """Published events to the sagas of one orchestrator that wait for them."""

    def __init__(
        self, waits: EventWaits, read: ReadRecord, definition: DefinitionOf, apply: ApplySignal
    ) -> None:
        self.waits = waits
        self._read = read
        self._definition = definition
        self._apply = apply

    def on_event(
        self,
        tx: Tx,
        event: BaseModel,
        envelope: Envelope,
        steps: Sequence[WaitStep],
        metrics: Metrics | None = None,
        batch: StagedSagaWrites | None = None,
    ) -> None:
        """End the wait of every saga waiting for ``event`` under a key it carries
        (``steps``: the wait steps for its type); keep it under the keys nobody waited for."""
        keys = sorted({key for step in steps if (key := step.key_of_event(event)) is not None})
        self.waits.lock(tx, envelope.type, keys)
        found = set(self.waits.waiting(tx, envelope.type, keys))
        if batch is not None:  # a delivery earlier in the batch may have begun the wait
            found.update(batch.waiting_for_event(envelope.type, keys))
        delivered: set[str] = set()
        for saga_id in sorted(found):
            record = self._read(tx, saga_id, batch)
            key = self._key_for(record, event) if record is not None else None
            if record is not None and key is not None and awaits_event(record, envelope.type, key):
                signal = Signal(saga_id=saga_id, event=envelope.type, data=envelope.payload)
                self._apply(tx, record, signal, "event", metrics, batch)
                delivered.add(key)
        if kept := [key for key in keys if key not in delivered]:
            self.waits.park(tx, envelope.type, kept, envelope.message_id, envelope.payload)

    def deliver_early(
        self,
        tx: Tx,
        record: SagaRecord,
        wait: tuple[str, str],
        metrics: Metrics | None,
        batch: StagedSagaWrites | None,
    ) -> None:
        """The saga began to wait for ``wait`` (event type, key): an event that came before
        ends the wait at once. Kept events are offered oldest first until one ends it: one
        the saga refuses (a wait past the pivot whose ``on_event`` fails) is dropped, as it
        would be had it come during the wait, and the saga is never left waiting while an
        event for its key is kept."""
        event_type, key = wait
        self.waits.lock(tx, event_type, [key])
        while (early := self.waits.take(tx, event_type, key)) is not None:
            current = self._read(tx, record.id, batch) if batch is not None else record
            assert current is not None  # a refused event leaves the record as it was
            signal = Signal(saga_id=record.id, event=event_type, data=early.payload)
            if self._apply(tx, current, signal, "early event", metrics, batch):
                return

    def _key_for(self, record: SagaRecord, event: BaseModel) -> str | None:
        """The key ``event`` carries for the wait step ``record`` is at (None: no such wait)."""
        step = self._definition(record).step(record.step) if record.step else None
        return step.key_of_event(event) if step is not None else None
