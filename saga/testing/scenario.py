"""A saga's logic alone, on its pure transitions: no database, no service, no broker.

Given a saga and its data, expect this command at that service, given this
reply, expect the next one...: each answer goes through the same
:class:`~saga.engine.transitions.Transition` and the same routing questions
(:mod:`saga.engine.staleness`) the orchestrator asks, on a record kept in memory.
Local steps write to the database, so a scenario runs them stubbed: a function
of the saga's data, given by the test, or nothing at all.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from saga.engine.definition import LocalAction, Saga
from saga.engine.staleness import (
    awaits,
    awaits_reply,
    deadline_applies,
    may_undo,
    wait_timeout_applies,
)
from saga.engine.state import SagaRecord, StepLogEntry
from saga.engine.transition_results import LocalOutcome
from saga.engine.transitions import Transition
from saga.errors import StepFailed
from saga.handlers.context import HandlerContext
from saga.messaging.control import FailureReply, Signal, StepDeadline, StepTimer, WaitTimeout
from saga.messaging.envelope import STEP_HEADER, Envelope, message_type_of
from saga.messaging.ids import uuid7
from saga.testing.clock import VirtualClock
from saga.testing.messages import (
    Expected,
    Message,
    SentMessages,
    check_message,
    check_messages,
    check_messages_in_any_order,
)
from saga.testing.stubs import Answer, Fail, PendingCommand, Stubs, as_reply

#: A local step's stand-in: a function of the saga's data (new data, or None), or None
#: for a step that only writes (it does nothing here).
LocalStub = Callable[[Any], BaseModel | None] | None


class StubbedLocalSteps:
    """Runs each local step (or local compensation) as the test's stub, by function name."""

    def __init__(self, stubs: Mapping[str, LocalStub], clock: VirtualClock) -> None:
        self.stubs = dict(stubs)
        self.clock = clock
        self.calls: list[str] = []

    def run(self, action: LocalAction, data: BaseModel, *, compensation: bool) -> LocalOutcome:
        name = action.__name__
        if name not in self.stubs:
            raise AssertionError(
                f"local step {name!r} needs the database; stub it: local_steps={{{name!r}: ...}}"
            )
        self.calls.append(name)
        stub = self.stubs[name]
        at = self.clock.now()
        try:
            result = stub(data) if stub is not None else None
        except Exception as exc:
            if compensation or isinstance(exc, StepFailed):
                return LocalOutcome(None, exc, at, at)
            raise
        return LocalOutcome(result, None, at, at)


class SagaScenario:
    """One saga, started from ``data``, driven by the test's answers on a virtual clock.

    Every command the saga sends waits for the test (``expect_command(...).reply(...)``
    or ``.fail(...)``), unless a rule answers it (:meth:`on`). Timers (retries, wait
    timeouts, deadlines) fire on :meth:`advance`.
    """

    def __init__(
        self,
        saga: Saga[Any],
        data: BaseModel,
        *,
        local_steps: Mapping[str, LocalStub] = {},
        home_service: str = "saga",
        clock: VirtualClock | None = None,
    ) -> None:
        self.saga = saga
        self.home_service = home_service
        self.clock = clock or VirtualClock()
        self.stubs = Stubs()
        #: every command sent, in order; ``sent(service, Type, where=...)`` finds matches
        self.sent = SentMessages()
        self.log: list[StepLogEntry] = []
        self.ignored: list[Envelope] = []  # answers that came after the saga moved on
        self._local = StubbedLocalSteps(local_steps, self.clock)
        self._inbox: list[tuple[Envelope, BaseModel]] = []
        self._timers: list[tuple[datetime, int, Envelope, BaseModel]] = []
        self._seq = itertools.count()
        self.record = SagaRecord.new(
            uuid7(), saga.name, saga.version, home_service, data.model_dump(mode="json")
        )
        self._transition(None, lambda run: run.advance(0))

    # -- the test's answers ---------------------------------------------------------

    def expect_command(self, service: str, expected: Expected | None = None) -> PendingCommand:
        """The oldest unanswered command at ``service``, checked against ``expected``
        (a whole message, or a type); answer it with ``.reply``/``.fail``."""
        self.run_until_idle()
        message = self.stubs.take(service, expected)
        if expected is not None:
            check_message(expected, message, f"command sent to {service}")
        return PendingCommand(self, message)

    def on(self, service: str, command: type[BaseModel], answer: Answer) -> None:
        """Answer every ``command`` sent to ``service`` with ``answer``, those already
        waiting (the saga's first command is sent when the scenario starts) included."""
        self.stubs.add_rule(service, message_type_of(command), answer)
        for message in self.stubs.take_all(service, command):
            given = self.stubs.receive(message)
            assert given is not None
            self.answer(message, given)

    def answer(self, command: Message, answer: BaseModel | Fail) -> None:
        """What the participant answers to ``command``, delivered by the next run."""
        ctx = HandlerContext(command.envelope, command.service)
        if ctx.reply(as_reply(answer, command)) is None:
            raise AssertionError(f"{command!r} expects no reply")
        self._inbox.append((ctx.outgoing[-1].envelope, as_reply(answer, command)))

    def signal(self, event: str, data: BaseModel | dict[str, Any]) -> str | None:
        """Send the saga ``event``; returns why it was refused, if it was."""
        payload = data.model_dump(mode="json") if isinstance(data, BaseModel) else data
        signal = Signal(saga_id=self.record.id, event=event, data=payload)
        refused: list[str | None] = []
        self._transition(None, lambda run: refused.append(run.on_signal(signal)))
        return refused[0]

    def cancel(self, reason: str = "cancelled by the test") -> None:
        """Ask the saga to compensate from where it is, as ``saga cancel`` does: it does
        once the step it waits at has answered."""
        self.record.cancel_requested = True
        self.record.last_error = reason

    def resume(self) -> bool:
        """Resume the saga, as ``saga resume`` does (what it waits for is sent again);
        False when there was nothing to resume."""
        resumed: list[bool] = []
        self._transition(None, lambda run: resumed.append(run.resume()))
        return resumed[0]

    def run_until_idle(self) -> int:
        """Hand the saga every answer waiting for it, and the commands it sends to the rules."""
        handled = 0
        while self._inbox:
            self._receive(*self._inbox.pop(0))
            handled += 1
        return handled

    def advance(self, delta: timedelta) -> int:
        """Move the clock by ``delta``, firing the saga's timers that fall due, earliest first."""
        target = self.clock.now() + delta
        fired = self.run_until_idle()
        while self._timers and self._timers[0][0] <= target:
            due, _, envelope, timer = heapq.heappop(self._timers)
            self.clock.move_to(due)
            self._receive(envelope, timer)
            fired += 1 + self.run_until_idle()
        self.clock.move_to(target)
        return fired

    # -- what happened ------------------------------------------------------------------

    @property
    def status(self) -> str:
        return self.record.status.value

    @property
    def step(self) -> str | None:
        return self.record.step

    @property
    def data(self) -> BaseModel:
        data: BaseModel = self.saga.data_model.model_validate(self.record.data)
        return data

    @property
    def local_calls(self) -> list[str]:
        """The local steps and compensations run (stubbed), in order."""
        return list(self._local.calls)

    @property
    def steps(self) -> list[str]:
        """The step log in short, as :meth:`SagaHarness.steps` gives it."""
        return [
            f"{e.step} {e.outcome}" if e.phase == "forward" else f"{e.step} {e.phase} {e.outcome}"
            for e in self.log
        ]

    @property
    def scheduled(self) -> list[tuple[datetime, BaseModel]]:
        """The saga's timers not yet due, earliest first."""
        return [(due, timer) for due, _, _, timer in sorted(self._timers, key=lambda t: t[:2])]

    def sent_to(self, service: str) -> list[Message]:
        return [m for m in self.sent if m.destination == service]

    def assert_sent(self, service: str, *expected: Expected, any_order: bool = False) -> None:
        """Everything sent to ``service`` so far is ``expected``: in order, or in any order
        with ``any_order=True``."""
        check = check_messages_in_any_order if any_order else check_messages
        self.run_until_idle()
        check(expected, self.sent_to(service), f"messages sent to {service}")

    # -- the orchestrator's part, in memory ------------------------------------------------

    def _receive(self, envelope: Envelope, body: BaseModel) -> None:
        """What the orchestrator does with a message for this saga (routing, then transition)."""
        record = self.record
        if isinstance(body, StepTimer):
            if awaits(record, envelope.message_id):  # as the orchestrator asks
                self._transition(envelope, lambda run: run.on_timer(body))
        elif isinstance(body, WaitTimeout):
            if wait_timeout_applies(record, envelope):
                self._transition(envelope, lambda run: run.on_wait_timeout())
        elif isinstance(body, StepDeadline):
            if deadline_applies(record, body):
                self._transition(envelope, lambda run: run.on_deadline(body))
        elif awaits_reply(record, envelope):
            if isinstance(body, FailureReply):
                self._transition(envelope, lambda run: run.on_failure(body))
            else:
                self._transition(envelope, lambda run: run.on_success(body))
        elif may_undo(body, envelope):
            step = envelope.headers.get(STEP_HEADER, "")
            self._transition(envelope, lambda run: run.undo_late_success(step, body))
        else:
            self.ignored.append(envelope)

    def _transition(self, cause: Envelope | None, event: Callable[[Transition], object]) -> None:
        run = Transition(
            self.saga, self.record, cause=cause, at=self.clock.now(),
            home_service=self.home_service, local_steps=self._local,
        )  # fmt: skip
        event(run)
        result = run.result()
        self.record = result.record
        self.log.extend(result.log)
        for outgoing in result.outgoing:
            envelope = outgoing.envelope
            if outgoing.destination == self.home_service:  # one of the saga's own timers
                timer = _TIMERS[envelope.type].model_validate(envelope.payload)
                after = outgoing.deliver_after or timedelta()
                due = after if isinstance(after, datetime) else self.clock.now() + after
                heapq.heappush(self._timers, (due, next(self._seq), envelope, timer))
                continue
            message = Message(outgoing.destination, envelope, envelope.to_bytes())
            self.sent.append(message)
            answer = self.stubs.receive(message)
            if answer is not None:
                self.answer(message, answer)


_TIMERS: dict[str, type[BaseModel]] = {
    message_type_of(m): m for m in (StepTimer, WaitTimeout, StepDeadline)
}
