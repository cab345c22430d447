"""What the model-based tests of sagas share (tests/unit/test_*_model.py).

The generated sagas' data and messages (:class:`Data`, :class:`Command`, :class:`Undo`) and
how the model's participant answers (:func:`model_reply`, :func:`reply_envelope`), so the
models of transitions, parallel groups and fan-outs play the same world.
:class:`Reference` says what must be undone, in what order; :class:`MemorySteps` runs local
steps as the orchestrator's savepoint runner does, and :class:`MemoryEventWaits` keeps early
events as ``saga.early_events`` does, both without a database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from saga.engine.definition import LocalAction
from saga.engine.event_waits import EarlyEvent, EventWaits
from saga.engine.transition_results import LocalOutcome
from saga.errors import StepFailed
from saga.messaging.control import Ack, FailureReply
from saga.messaging.envelope import COMPENSATES_HEADER, STEP_HEADER, Envelope

HOME = "home"
SAGA_ID = UUID(int=1)


class Data(BaseModel):
    order: str = "o-1"


class Command(BaseModel):
    step: str


class Undo(BaseModel):
    step: str


def model_reply(request: Envelope, outcome: str) -> BaseModel:
    """The participant's answer to ``request`` when drawn ``outcome``: an ack for "ok", else
    a failure (a business failure, or one with ``outcome`` as its code)."""
    if outcome == "ok":
        return Ack()
    code = None if outcome == "failed" else outcome
    return FailureReply(reason=f"{outcome} by the model", code=code, failed_type=request.type)


def reply_envelope(request: Envelope, reply: BaseModel, message_id: UUID) -> Envelope:
    """A participant's answer to ``request``: it names the request's step, as replies do."""
    headers = {k: v for k in (STEP_HEADER, COMPENSATES_HEADER) if (v := request.headers.get(k))}
    return Envelope.wrap(
        reply,
        message_id=message_id,
        saga_id=SAGA_ID,
        causation_id=request.message_id,
        headers=headers,
    )


class MemorySteps:
    """Runs local steps the way the orchestrator's savepoint runner does, without a database."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def run(self, action: LocalAction, data: BaseModel, *, compensation: bool) -> LocalOutcome:
        try:
            result = action(None, data)
        except StepFailed as failure:
            return LocalOutcome(None, failure, self.at, self.at)
        except Exception as exc:
            if not compensation:
                raise
            return LocalOutcome(None, exc, self.at, self.at)
        return LocalOutcome(result, None, self.at, self.at)


class MemoryEventWaits(EventWaits):
    """The statements of :class:`EventWaits` over a list, oldest first, for one process
    (nothing to lock): what the orchestrator's :class:`EventDelivery` keeps and takes."""

    def __init__(self) -> None:
        self.kept: list[tuple[str, str, UUID, dict[str, Any]]] = []  # type, key, id, payload

    def lock(self, tx: Any, event_type: str, keys: Sequence[str]) -> None:
        pass

    def park(
        self,
        tx: Any,
        event_type: str,
        keys: Sequence[str],
        message_id: UUID,
        payload: dict[str, Any],
    ) -> None:
        self.kept.extend((event_type, key, message_id, payload) for key in keys)

    def take(self, tx: Any, event_type: str, key: str) -> EarlyEvent | None:
        row = next((row for row in self.kept if row[:2] == (event_type, key)), None)
        if row is None:
            return None
        self.kept.remove(row)
        return EarlyEvent(row[2], row[3])


@dataclass
class Reference:
    """What must be undone, in what order: steps in the order they took effect.

    A step takes effect when it succeeds; a remote step whose outcome is unknown (its
    command was dead-lettered or purged, or its deadline passed) may have, and is
    undone like one that succeeded when the saga compensates; one that succeeds after the
    saga compensated past it is undone late (:meth:`late_effect`).
    """

    compensable: set[str]
    pivot: str | None
    took_effect: list[str] = field(default_factory=list)
    undone: list[str] = field(default_factory=list)
    pivot_passed: bool = False
    cancelled: bool = False

    def next_to_undo(self) -> str | None:
        pending = [s for s in self.took_effect if s in self.compensable]
        return pending[-1] if pending else None

    def effect(self, step: str, *, certain: bool = True) -> None:
        """``step`` took effect (``certain``) or may have; only a pivot that succeeded is passed."""
        assert step not in self.took_effect, f"{step} took effect twice"
        self.took_effect.append(step)
        self.pivot_passed = self.pivot_passed or (certain and step == self.pivot)

    def late_effect(self, step: str) -> None:
        """``step`` took effect after the saga compensated past it: it is undone right after
        the step being undone now (or that stopped the saga), or next when none is."""
        current = self.next_to_undo()
        at = self.took_effect.index(current) if current is not None else len(self.took_effect)
        self.took_effect.insert(at, step)

    def compensating(self, step: str) -> None:
        assert not self.pivot_passed, f"{step} compensated after the pivot {self.pivot} completed"
        expected = self.next_to_undo()
        assert step == expected, (
            f"compensating {step}, expected {expected} (took effect: {self.took_effect}, "
            f"undone: {self.undone})"
        )

    def compensated(self, step: str) -> None:
        self.compensating(step)
        del self.took_effect[self.took_effect.index(step) :]
        self.undone.append(step)
