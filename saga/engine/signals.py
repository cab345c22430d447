"""Signals: external events for sagas that wait for them.

A signal is checked against the saga's row when it is sent (the saga exists,
runs, and waits for this event) and goes to the saga's home service through
the outbox, in the sender's transaction. If the wait's timeout wins the race
before the signal is applied, the signal is recorded as ignored.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from saga.db.sql import Tx
from saga.engine.state import SagaRecord, SagaStatus
from saga.errors import SignalRejected
from saga.messaging.control import Signal
from saga.messaging.envelope import Envelope
from saga.messaging.outbox import Outbox, OutgoingMessage


def check_waiting(record: SagaRecord | None, saga_id: UUID, event: str) -> SagaRecord:
    """The saga's record if it waits for ``event``; a clear :class:`SignalRejected` if not."""
    if record is None:
        raise SignalRejected(f"no saga {saga_id}")
    if record.status is not SagaStatus.RUNNING:
        raise SignalRejected(f"saga {saga_id} is {record.status.value}; it waits for nothing")
    if record.waiting_for is None:
        raise SignalRejected(
            f"saga {saga_id} is not waiting for an event (it is at step {record.step!r})"
        )
    if record.waiting_for != event:
        raise SignalRejected(f"saga {saga_id} is waiting for {record.waiting_for!r}, not {event!r}")
    return record


def signal_message(record: SagaRecord, event: str, data: dict[str, Any]) -> OutgoingMessage:
    """The signal for ``record``'s saga, addressed to its home service."""
    envelope = Envelope.wrap(Signal(saga_id=record.id, event=event, data=data), saga_id=record.id)
    return OutgoingMessage(envelope, record.service)


def queue_signal(
    tx: Tx,
    outbox: Outbox,
    record: SagaRecord,
    event: str,
    data: dict[str, Any],
) -> UUID:
    """Send the signal to the saga's home service in the caller's transaction."""
    message = signal_message(record, event, data)
    outbox.add_many(tx, [message])
    return message.envelope.message_id
