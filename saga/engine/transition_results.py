"""What a transition hands back, and how it asks its caller to run a local step.

:class:`TransitionResult` is everything a transition decided, for the caller to write
in its transaction (the dead letter of a saga that stopped for an operator is made by
:func:`stopped_saga_letter`); :class:`LocalSteps` is what runs a saga's local step for
it (the orchestrator in savepoints, a test in memory), reporting a :class:`LocalOutcome`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from pydantic import BaseModel

from saga.engine.definition import LocalAction
from saga.engine.state import SagaRecord, SagaStatus, StepLogEntry
from saga.messaging.control import ResumeSaga
from saga.messaging.dead_letters import DeadLetter
from saga.messaging.envelope import Envelope
from saga.messaging.outbox import OutgoingMessage


@dataclass(frozen=True, slots=True)
class LocalOutcome:
    """How a local step (or local compensation) went: a result, or the error it raised."""

    result: BaseModel | None
    error: Exception | None
    started: datetime
    finished: datetime


class LocalSteps(Protocol):
    """Runs a saga's local step for a transition (in the caller's transaction)."""

    def run(self, action: LocalAction, data: BaseModel, *, compensation: bool) -> LocalOutcome:
        """Run ``action``; a forward step reports only :class:`StepFailed` as its
        error (anything else propagates), a compensation reports any exception."""
        ...


@dataclass(frozen=True, slots=True)
class TransitionResult:
    """What a transition decided: everything the caller writes in its transaction."""

    record: SagaRecord
    log: list[StepLogEntry]
    outgoing: list[OutgoingMessage]
    dead_letters: list[DeadLetter]
    #: The status the saga reached when it finished or stopped for an operator here.
    ended: SagaStatus | None
    #: (event type, key) when the saga began to wait for a published event here: one
    #: that came before may be waiting for it (the caller looks, and delivers it).
    started_wait: tuple[str, str] | None = None


def stopped_saga_letter(
    record: SagaRecord, home_service: str, error_type: str, reason: str
) -> DeadLetter:
    """The dead letter of a saga that stopped for an operator: replaying it resumes the saga
    (the same as ``saga resume``)."""
    body = Envelope.wrap(
        ResumeSaga(saga_id=record.id, reason="dead letter replayed"), saga_id=record.id
    )
    return DeadLetter(
        consumer=home_service,
        reason="failed",
        body=body.to_bytes(),
        content_type="application/json",
        message_id=body.message_id,
        message_type=body.type,
        saga_id=record.id,
        destination=home_service,
        error_type=error_type,
        error_message=f"saga {record.name} {record.id}: {reason} "
        f"(after {record.step_attempt} attempts; `saga resume {record.id}` once fixed)",
        attempts=record.step_attempt,
    )
