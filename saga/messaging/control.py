"""Control messages between services: replies, retry timers, deadlines, signals, resumes."""

from __future__ import annotations

from typing import Any, ClassVar
from uuid import UUID

from pydantic import BaseModel

#: ``FailureReply.code`` when the participant gave up after its retries
#: (a dead letter exists in its database).
DEAD_LETTERED = "dead_lettered"

#: ``FailureReply.code`` when an operator purged the dead letter of the request: it will
#: never run, so a saga held at that step compensates (the step included).
PURGED = "purged"

#: ``FailureReply.code`` when the participant refused a command because the step was
#: already compensated there; the saga has moved on and ignores it.
STEP_CLOSED = "step_closed"


class FailureReply(BaseModel):
    """Sent to ``reply_to`` when a handler raises :class:`~saga.errors.StepFailed`,
    or when a request with a ``reply_to`` becomes a dead letter."""

    message_type: ClassVar[str] = "saga.FailureReply"

    reason: str
    code: str | None = None
    failed_type: str


class Ack(BaseModel):
    """The success reply of a handler that returned None."""

    message_type: ClassVar[str] = "saga.Ack"


class StepTimer(BaseModel):
    """A scheduled message the orchestrator sends itself to try a step again."""

    message_type: ClassVar[str] = "saga.StepTimer"

    saga_id: UUID
    step: str
    phase: str
    attempt: int


class StartSaga(BaseModel):
    """Sent to a saga's home service by ``start_async``: run the saga's first steps.

    An async caller cannot run local steps (they take a synchronous connection),
    so its transaction records the saga and this message; the orchestrator then
    moves the saga on in its own transaction, as for any later step.
    """

    message_type: ClassVar[str] = "saga.StartSaga"

    saga_id: UUID


class ResumeSaga(BaseModel):
    """Sent to a saga's home service by ``saga resume`` (or a replayed saga dead letter)."""

    message_type: ClassVar[str] = "saga.ResumeSaga"

    saga_id: UUID
    reason: str = "operator"


class Signal(BaseModel):
    """An external event for a waiting saga (``saga signal`` or ``registry.signal``)."""

    message_type: ClassVar[str] = "saga.Signal"

    saga_id: UUID
    event: str
    data: dict[str, Any]


class WaitTimeout(BaseModel):
    """Fires when a wait step's timeout passes (a scheduled message)."""

    message_type: ClassVar[str] = "saga.WaitTimeout"

    saga_id: UUID
    step: str


class StepDeadline(BaseModel):
    """Fires when a remote step's deadline passes without its reply."""

    message_type: ClassVar[str] = "saga.StepDeadline"

    saga_id: UUID
    step: str
    awaited: UUID
    attempt: int
