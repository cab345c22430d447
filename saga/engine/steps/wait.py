"""A wait step: a durable wait for a named external event, with a timeout.

What it keeps while the saga waits (the event, its key, the schema signals are checked
against, the deadline) is its part of the record, :attr:`SagaRecord.step_state`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from saga.engine.state import Phase, SagaStatus
from saga.engine.steps.kind import StepKind, StepShape
from saga.engine.steps.options import COMPENSATE, Condition, KeyOf, ReplyHandler, StepRetry
from saga.errors import ConfigurationError, StepFailed
from saga.messaging.control import Signal, WaitTimeout
from saga.messaging.outbox import OutgoingMessage

if TYPE_CHECKING:
    from saga.engine.definition import Saga
    from saga.engine.transitions import Transition


@cache
def _schema(payload: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema a waiting saga checks signals against (the same for every wait)."""
    return payload.model_json_schema()


@dataclass(frozen=True, slots=True)
class WaitStep(StepKind):
    """A durable wait for a named external event (``saga signal``), with a timeout.

    While it waits no process holds the saga: it is a row, and its timeout a
    scheduled message. ``on_event(data, event)`` returns the new data (or
    None); raising :class:`~saga.errors.StepFailed` compensates, or, after the
    pivot, refuses the event and keeps waiting. On timeout the saga compensates,
    or jumps to the step named by ``on_timeout``.

    With ``correlate`` the wait is for a published event (``payload`` is its class):
    the saga waits under the key ``correlate(data)``, and an event whose
    ``event_key(event)`` is that key ends the wait (a signal still does too).
    """

    name: str
    event: str
    payload: type[BaseModel]
    timeout: timedelta | None = None
    on_event: ReplyHandler | None = None
    on_timeout: str = COMPENSATE
    when: Condition | None = None
    pivot: bool = False
    retry: StepRetry | None = None
    compensation: None = None
    correlate: KeyOf | None = None
    event_key: KeyOf | None = None

    kind = "wait"

    def signal_payload(self) -> type[BaseModel] | None:
        return self.payload

    def event_waits(self) -> tuple[WaitStep, ...]:
        return (self,) if self.correlate is not None else ()

    def key_of_data(self, data: BaseModel) -> str | None:
        """The key this wait is under for ``data``; None for a wait that no event ends."""
        return _key(self.correlate, data, f"correlate of wait step {self.name!r}")

    def key_of_event(self, event: BaseModel) -> str | None:
        """The key ``event`` carries for this wait (None when it waits for no event)."""
        return _key(self.event_key, event, f"event_key of wait step {self.name!r}")

    # -- moving forward --------------------------------------------------------

    def begin(self, t: Transition) -> bool:
        record = t.record
        record.status = SagaStatus.RUNNING
        record.step = self.name
        record.step_attempt = 1
        record.step_started_at = t.at
        state: dict[str, Any] = {"waiting_for": self.event, "wait_schema": _schema(self.payload)}
        if (key := self.key_of_data(t.data)) is not None:  # an early event may end it now
            t.started_wait = (self.event, key)
            state["wait_key"] = key
        if self.timeout is None:
            record.pending_message_id = t.new_id()  # only a signal will end this wait
        else:
            timeout = t.envelopes.control(WaitTimeout(saga_id=record.id, step=self.name), self)
            t.outgoing.append(OutgoingMessage(timeout, t.home_service, self.timeout))
            record.pending_message_id = timeout.message_id
            state["wait_deadline"] = (t.at + self.timeout).isoformat()
        record.step_state = state
        return False

    # -- answers ---------------------------------------------------------------

    def take_event(self, t: Transition, signal: Signal) -> str | None:
        record = t.record
        if record.waiting_for != signal.event:
            waiting = f"waiting for {record.waiting_for!r}" if record.waiting_for else "not waiting"
            return f"saga is {record.status.value} and {waiting}"
        event = self.payload.model_validate(signal.data)
        try:
            result = self.on_event(t.data, event) if self.on_event else None
        except StepFailed as failure:
            reason = f"{self.name}: {failure.reason}"
            if t.saga.after_pivot(self.name):  # past the pivot the saga only goes forward
                return f"{reason}; past the pivot, so the saga keeps waiting"
            record.step_state = {}
            t.log_step(self, Phase.FORWARD, "failed", record.step_started_at, reason)
            t.begin_compensation(reason, self)
            return None
        record.step_state = {}
        if result is not None:
            t.set_data(result, f"on_event of {self.name!r}")
        t.log_step(self, Phase.FORWARD, "succeeded", record.step_started_at)
        record.completed_steps.append(self.name)
        t.go_on(t.saga.index(self.name) + 1)
        return None

    def take_timeout(self, t: Transition) -> None:
        reason = f"{self.name}: no {self.event!r} within {self.timeout}"
        t.log_step(self, Phase.FORWARD, "timed_out", t.record.step_started_at, reason)
        t.record.step_state = {}
        if self.on_timeout == COMPENSATE:
            t.begin_compensation(reason, self)
        else:
            t.go_on(t.saga.index(self.on_timeout))

    # -- registration ----------------------------------------------------------

    def shape(self) -> StepShape:
        on_timeout = self.on_timeout if self.timeout is not None else None
        return {**StepKind.shape(self), "event": self.event, "on_timeout": on_timeout}

    def problems(
        self, saga: Saga[Any], index: int, routes: dict[type[BaseModel], str]
    ) -> list[str]:
        problems: list[str] = []
        if not (isinstance(self.payload, type) and issubclass(self.payload, BaseModel)):
            problems.append(f"wait step {self.name!r}: payload must be a pydantic model class")
        target = self.on_timeout
        if self.timeout is None:
            return problems  # without a timeout, on_timeout never applies
        pivot = saga.pivot_index
        if target != COMPENSATE:
            if target not in [s.name for s in saga.steps[index + 1 :]]:
                problems.append(
                    f"wait step {self.name!r}: on_timeout {target!r} is neither 'compensate' "
                    "nor a later step"
                )
        elif pivot is not None and index > pivot:
            problems.append(
                f"wait step {self.name!r} is after the pivot, so its timeout cannot compensate; "
                "name a later step in on_timeout"
            )
        return problems


def _key(key_of: KeyOf | None, value: BaseModel, what: str) -> str | None:
    """``key_of(value)`` as text: keys compare as text, whatever type they have."""
    if key_of is None:
        return None
    key = key_of(value)
    if key is None or key == "":
        raise ConfigurationError(f"{what} gave no key for {type(value).__name__} {value!r}")
    return str(key)
