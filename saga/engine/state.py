"""The state of one saga instance, as stored in ``saga_instances``."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID


class SagaStatus(StrEnum):
    """Where a saga stands. Completed is final, and so is compensated but for a step that
    succeeds late and must be undone; the last three need an operator.

    running -> completed
    running -> compensating -> compensated
    compensated -> compensating           (a step succeeded late: its compensation is out)
    compensating -> compensation_failed   (a compensation kept failing: operator)
    running -> forward_failed             (a step after the pivot kept failing: operator)
    running -> step_dead_lettered         (a held step's command is a dead letter: operator
                                           replays it to go on, or purges it to compensate)
    """

    RUNNING = "running"
    COMPENSATING = "compensating"
    COMPLETED = "completed"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    FORWARD_FAILED = "forward_failed"
    STEP_DEAD_LETTERED = "step_dead_lettered"

    @property
    def finished(self) -> bool:
        return self in (SagaStatus.COMPLETED, SagaStatus.COMPENSATED)

    @property
    def needs_operator(self) -> bool:
        return self in (
            SagaStatus.COMPENSATION_FAILED,
            SagaStatus.FORWARD_FAILED,
            SagaStatus.STEP_DEAD_LETTERED,
        )


class Phase(StrEnum):
    FORWARD = "forward"
    COMPENSATION = "compensation"


def data_fingerprint(data: dict[str, Any]) -> str:
    """A digest of saga data (as JSON), kept with a start's idempotency key."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def waiting_on(step: str | None, step_state: dict[str, Any]) -> list[str]:
    """The steps a saga at ``step`` waits on: a parallel group's members still out (their
    messages still awaited, in the order they were sent; a fan-out member once), else the
    step itself. A group that failed may keep a fan-out member's items still out under
    ``members`` while a fan-out before it awaits its own compensations: none of those is a
    member's, and the saga waits on that fan-out."""
    members = step_state.get("members")
    if members and "awaits" in step_state:
        member_of = {
            message: name
            for name, entry in members.items()
            for message in ([entry["message"]] if "message" in entry else entry.get("awaits", ()))
        }
        out = [member_of[m] for m in step_state["awaits"] if m in member_of]
        if out:
            return list(dict.fromkeys(out))
    return [step] if step else []


@dataclass(slots=True)
class SagaRecord:
    """One ``saga_instances`` row; ``version`` guards every update."""

    id: UUID
    name: str
    saga_version: int
    service: str
    status: SagaStatus
    step: str | None
    data: dict[str, Any]
    completed_steps: list[str]
    pending_message_id: UUID | None
    step_attempt: int
    cancel_requested: bool
    pivot_reached: bool
    last_error: str | None
    idempotency_key: str | None
    version: int
    started_at: datetime | None = None
    updated_at: datetime | None = None
    step_started_at: datetime | None = None
    finished_at: datetime | None = None
    failed_step: str | None = None  # the forward step whose failure made it compensate
    #: What the kind of step the saga is at keeps (JSON), owned by that kind's object in
    #: :mod:`saga.engine.steps`; empty between steps.
    step_state: dict[str, Any] = field(default_factory=dict)

    @property
    def waiting_for(self) -> str | None:
        """The event the saga waits for (a wait step's), if any."""
        value = self.step_state.get("waiting_for")
        return None if value is None else str(value)

    @property
    def waiting_on(self) -> list[str]:
        """See :func:`waiting_on`."""
        return waiting_on(self.step, self.step_state)

    @property
    def wait_key(self) -> str | None:
        """The key of the published event the saga waits for, if any."""
        value = self.step_state.get("wait_key")
        return None if value is None else str(value)

    @classmethod
    def new(
        cls,
        saga_id: UUID,
        name: str,
        saga_version: int,
        service: str,
        data: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        pending_message_id: UUID | None = None,
    ) -> SagaRecord:
        """A saga about to start: running, nothing done yet, never written."""
        return cls(
            id=saga_id,
            name=name,
            saga_version=saga_version,
            service=service,
            status=SagaStatus.RUNNING,
            step=None,
            data=data,
            completed_steps=[],
            pending_message_id=pending_message_id,
            step_attempt=1,
            cancel_requested=False,
            pivot_reached=False,
            last_error=None,
            idempotency_key=idempotency_key,
            version=0,
        )


@dataclass(frozen=True, slots=True)
class StepLogEntry:
    """One row of ``saga_steps``: an attempt of a step or of its compensation."""

    saga_id: UUID
    step: str
    phase: Phase
    attempt: int
    outcome: str
    started_at: datetime
    finished_at: datetime
    error: str | None = None
    message_id: UUID | None = None


@dataclass(slots=True)
class SagaSummary:
    """A row of ``saga list``."""

    id: UUID
    name: str
    saga_version: int
    status: str
    step: str | None
    last_error: str | None
    started_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    step_state: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def waiting_on(self) -> list[str]:
        """See :func:`waiting_on`."""
        return waiting_on(self.step, self.step_state)
