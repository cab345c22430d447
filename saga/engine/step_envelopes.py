"""The envelopes one saga's transition sends: commands, compensations and its own timers.

Every envelope a transition builds names the saga, carries the correlation of the
event that caused it and a fresh message id (unless a retry reuses one); commands
and compensations carry their step and the idempotency key a participant keys its
closed-step record on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from saga.engine.definition import RemoteStep, Saga
from saga.engine.steps.kind import StepKind
from saga.messaging.envelope import (
    COMPENSATES_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    STEP_HEADER,
    Envelope,
)


@dataclass(frozen=True)
class StepEnvelopes:
    """Builds the envelopes of saga ``saga_id``, caused by ``cause`` (None: no event)."""

    saga: Saga[Any]
    saga_id: UUID
    cause: Envelope | None
    home_service: str
    new_id: Callable[[], UUID]

    def command(self, step: RemoteStep, data: BaseModel, message_id: UUID | None) -> Envelope:
        """The step's forward command, answered to the saga's home service."""
        message = self.saga.build_message(step, data)
        return self.request(message, step, self.step_key(step), message_id)

    def compensation(
        self, step: RemoteStep, data: BaseModel, message_id: UUID | None = None
    ) -> Envelope:
        """The step's compensation, under its own idempotency key, naming the step it undoes."""
        assert step.compensation is not None
        message = self.saga.build_message(step, data, compensation=True)
        return self.undo(message, step, self.step_key(step), message_id)

    def request(
        self, message: BaseModel, step: StepKind, key: str, message_id: UUID | None
    ) -> Envelope:
        """``message`` sent forward for ``step`` under idempotency key ``key``."""
        headers = {STEP_HEADER: step.name, IDEMPOTENCY_KEY_HEADER: key}
        return self._wrap(
            message, reply_to=self.home_service, headers=headers, message_id=message_id
        )

    def undo(
        self, message: BaseModel, step: StepKind, forward_key: str, message_id: UUID | None
    ) -> Envelope:
        """``message`` undoing what was sent under ``forward_key``, under a key of its own."""
        return self._wrap(
            message,
            reply_to=self.home_service,
            headers={
                STEP_HEADER: step.name,
                IDEMPOTENCY_KEY_HEADER: f"{forward_key}:compensation",
                COMPENSATES_HEADER: forward_key,
            },
            message_id=message_id,
        )

    def control(self, message: BaseModel, step: StepKind) -> Envelope:
        """A timer, deadline or wait timeout the saga sends itself about ``step``."""
        return self._wrap(message, headers={STEP_HEADER: step.name})

    def step_key(self, step: StepKind) -> str:
        """The idempotency key of a step's command: the same on every attempt of it."""
        return f"{self.saga_id}:{step.name}"

    def _wrap(
        self,
        message: BaseModel,
        *,
        headers: dict[str, str],
        reply_to: str | None = None,
        message_id: UUID | None = None,
    ) -> Envelope:
        cause = self.cause
        return Envelope.wrap(
            message,
            message_id=message_id or self.new_id(),
            saga_id=self.saga_id,
            correlation_id=cause.correlation_id if cause else self.saga_id,
            causation_id=cause.message_id if cause else None,
            reply_to=reply_to,
            headers=headers,
        )
