"""Model-based tests of saga transitions: any events, in any order, against a reference model.

Hypothesis draws a saga definition (remote, local and wait steps, some with
compensations, maybe a pivot, deadlines, held dead letters, wait timeouts, waits for
a published event by key) and then a sequence of events for one instance of it:
replies to the request the saga waits for, replies to older requests, failures
(business, dead-lettered, purged), timers and deadlines firing (late ones too),
signals, published events (its key or another, before or during its wait), cancels
and resumes. :class:`SagaMachine` plays the orchestrator with the pure
:class:`~saga.engine.transitions.Transition`, the routing questions of
:mod:`saga.engine.staleness`, the orchestrator's own delivery of kept events
(:class:`~saga.engine.event_waits.EventDelivery` over an in-memory ``early_events``) and
an in-memory record, so no server is needed.

After every event it checks the guarantees: a saga with nothing pending is
completed, compensated or waiting for an operator, and one with something pending
can still be moved on; compensations run in the reverse order in which steps took
effect (as :class:`Reference` tracks it); nothing at or after a completed pivot
is compensated; a cancelled saga never completes; a stale or duplicate reply
changes nothing (but a late success is undone by the step's compensation, awaited, retried
and given up on like any other, after the compensation under way); every
request carries its step's idempotency key; a saga waiting for an event is keyed by its
data, and never waits while an event for its key is kept. At the end a cooperative world
answers whatever the saga waits for, and the saga must finish or stop for an
operator.
"""

from __future__ import annotations

import copy
import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pydantic import BaseModel, ValidationError

from saga import Saga, StepRetry
from saga.engine.definition import COMPENSATE, HOLD, RETRY, WaitStep
from saga.engine.event_waits import EventDelivery
from saga.engine.staleness import (
    awaits,
    awaits_event,
    awaits_reply,
    deadline_applies,
    may_undo,
    wait_timeout_applies,
)
from saga.engine.state import Phase, SagaRecord, SagaStatus
from saga.engine.transition_results import TransitionResult
from saga.engine.transitions import Transition
from saga.errors import StepFailed
from saga.messaging.control import (
    DEAD_LETTERED,
    PURGED,
    STEP_CLOSED,
    FailureReply,
    Signal,
    StepDeadline,
    StepTimer,
    WaitTimeout,
)
from saga.messaging.envelope import (
    COMPENSATES_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    STEP_HEADER,
    Envelope,
    message_type_of,
)
from tests.support.saga_model import (
    HOME,
    SAGA_ID,
    Command,
    Data,
    MemoryEventWaits,
    MemorySteps,
    Reference,
    Undo,
    model_reply,
    reply_envelope,
)

COMPENSATING = (SagaStatus.COMPENSATING, SagaStatus.COMPENSATED, SagaStatus.COMPENSATION_FAILED)
#: How a participant answers: success, a business failure, or a failure code.
OUTCOMES = ["ok", "failed", DEAD_LETTERED, PURGED]
#: What the saga sends itself: retry timers, deadlines, wait timeouts.
CONTROL: dict[str, type[BaseModel]] = {
    message_type_of(m): m for m in (StepTimer, StepDeadline, WaitTimeout)
}


class Go(BaseModel):
    ok: bool


class Settled(BaseModel):
    """The published event a keyed wait waits for."""

    order: str
    ok: bool


SETTLED = message_type_of(Settled)


# -- saga definitions ------------------------------------------------------------------


@dataclass(frozen=True)
class StepShape:
    """One step of a generated saga, as Hypothesis prints it when it reports a failure."""

    name: str
    kind: str  # remote, local or wait
    compensated: bool = False
    pivot: bool = False
    deadline: str | None = None  # None, RETRY or COMPENSATE
    hold: bool = False  # on_dead_letter=HOLD
    timeout: str | None = None  # a wait's on_timeout (COMPENSATE or a later step); None: no timeout
    keyed: bool = False  # a wait for the published Settled of the saga's order, not a signal


@st.composite
def saga_shapes(draw: st.DrawFn) -> tuple[StepShape, ...]:
    kinds = draw(
        st.lists(st.sampled_from(["remote", "remote", "local", "wait"]), min_size=1, max_size=5)
    )
    if kinds.count("wait") > 1:  # one wait is enough to exercise signals and timeouts
        first = kinds.index("wait")
        kinds = [k if k != "wait" or i == first else "remote" for i, k in enumerate(kinds)]
    names = [f"s{i}" for i in range(len(kinds))]
    candidates = [i for i, kind in enumerate(kinds) if kind != "wait"]
    pivot = draw(st.none() | st.sampled_from(candidates)) if candidates else None
    shapes = []
    for i, kind in enumerate(kinds):
        after_pivot = pivot is not None and i > pivot
        if kind == "wait":
            targets = [None, *names[i + 1 :], *([] if after_pivot else [COMPENSATE])]
            timeout = draw(st.sampled_from(targets))
            shapes.append(StepShape(names[i], kind, timeout=timeout, keyed=draw(st.booleans())))
            continue
        compensated = not after_pivot and draw(st.booleans())
        if kind == "local":
            shapes.append(StepShape(names[i], kind, compensated, pivot == i))
            continue
        deadline = draw(st.sampled_from([None, RETRY, COMPENSATE]))
        shapes.append(
            StepShape(names[i], kind, compensated, pivot == i, deadline, draw(st.booleans()))
        )
    return tuple(shapes)


@dataclass
class LocalCode:
    """A local step or compensation; fails when the test says so (a forward step after
    the pivot never does: it may not fail, the engine refuses it)."""

    step: str
    compensation: bool
    may_fail: bool
    faults: list[bool]
    ran: list[tuple[str, bool, bool]]

    def __call__(self, tx: Any, data: Data) -> None:
        fail = bool(self.faults) and self.faults.pop(0) and self.may_fail
        self.ran.append((self.step, self.compensation, not fail))
        if fail and self.compensation:
            raise RuntimeError(f"compensation of {self.step} broke")
        if fail:
            raise StepFailed(f"{self.step} refused")


def _on_go(data: Data, event: Go | Settled) -> Data:
    if not event.ok:
        raise StepFailed("not approved")
    return data


def build(shapes: tuple[StepShape, ...], faults: list[bool], ran: list[Any]) -> Saga[Data]:
    saga: Saga[Data] = Saga("model", data=Data, retry=StepRetry(2, 1.0, 1.0))
    pivot = next((i for i, s in enumerate(shapes) if s.pivot), None)
    for i, shape in enumerate(shapes):
        name = shape.name
        if shape.kind == "remote":
            saga.remote(
                name,
                service="svc",
                command=lambda d, name=name: Command(step=name),
                compensate=(lambda d, name=name: Undo(step=name)) if shape.compensated else None,
                pivot=shape.pivot,
                deadline=timedelta(seconds=30) if shape.deadline else None,
                on_deadline=shape.deadline or RETRY,
                on_dead_letter=HOLD if shape.hold else COMPENSATE,
            )
        elif shape.kind == "local":
            may_fail = pivot is None or i <= pivot
            undo = LocalCode(name, True, True, faults, ran) if shape.compensated else None
            saga.local(name, compensate=undo, pivot=shape.pivot)(
                LocalCode(name, False, may_fail, faults, ran)
            )
        elif shape.keyed:
            saga.wait(
                name,
                event=Settled,
                correlate=lambda d: d.order,
                event_key="order",
                timeout=timedelta(minutes=5) if shape.timeout else None,
                on_event=_on_go,
                on_timeout=shape.timeout or COMPENSATE,
            )
        else:
            saga.wait(
                name,
                event="go",
                payload=Go,
                timeout=timedelta(minutes=5) if shape.timeout else None,
                on_event=_on_go,
                on_timeout=shape.timeout or COMPENSATE,
            )
    saga.validate()
    return saga


def _snapshot(record: SagaRecord) -> tuple[Any, ...]:
    return (
        record.status,
        record.step,
        record.data,
        list(record.completed_steps),
        record.pending_message_id,
        record.step_attempt,
        record.cancel_requested,
        record.waiting_for,
    )


# -- the state machine -------------------------------------------------------------------


class SagaMachine(RuleBasedStateMachine):
    """One saga instance, moved by an orchestrator made of Transition and the routing rules."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: Iterator[int] = itertools.count(100)
        self.clock = datetime(2025, 1, 1, tzinfo=UTC)
        self.faults: list[bool] = []
        self.ran: list[tuple[str, bool, bool]] = []
        self.requests: list[Envelope] = []  # commands and compensations sent to participants
        self.answered: list[Envelope] = []  # requests that got at least one reply
        self.scheduled: list[Envelope] = []  # timers, deadlines, wait timeouts not yet fired
        self.waits = MemoryEventWaits()  # published events no saga waited for: kept
        self.delivery = EventDelivery(
            self.waits,
            lambda tx, saga_id, batch: copy.deepcopy(self.record),
            lambda record: self.saga,
            lambda tx, record, signal, what, metrics, batch: self.apply_signal(signal, []),
        )

    @property
    def early(self) -> list[dict[str, Any]]:
        """The payloads of the events kept, oldest first."""
        return [payload for *_, payload in self.waits.kept]

    def new_id(self) -> UUID:
        return UUID(int=next(self.ids))

    # -- playing the orchestrator ---------------------------------------------------

    def transition(self, cause: Envelope | None, faults: list[bool]) -> Transition:
        """A transition of a copy of the stored record (the orchestrator loads it afresh)."""
        self.clock += timedelta(seconds=1)
        self.faults[:] = faults
        self.ran.clear()
        return Transition(
            self.saga,
            copy.deepcopy(self.record),
            cause=cause,
            at=self.clock,
            home_service=HOME,
            local_steps=MemorySteps(self.clock),
            new_id=self.new_id,
        )

    def commit(self, run: Transition, in_doubt: str | None = None) -> TransitionResult:
        """Store what ``run`` decided, after checking it against the reference."""
        result = run.result()
        self.check_messages(result)
        self.follow(result, in_doubt)
        self.record = result.record
        self.record.version += 1
        for message in result.outgoing:
            target = self.scheduled if message.destination == HOME else self.requests
            target.append(message.envelope)
        if result.dead_letters:  # a saga gives up visibly: a dead letter, and an operator's turn
            assert result.record.status.needs_operator and result.ended is result.record.status
        if result.started_wait is not None:  # the orchestrator's own delivery of kept events
            assert result.started_wait == (SETTLED, Data().order)
            self.delivery.deliver_early(None, self.record, result.started_wait, None, None)
        return result

    def apply_signal(self, signal: Signal, faults: list[bool]) -> bool:
        """Apply ``signal`` as the orchestrator does; False when the saga refused it."""
        run = self.transition(None, faults)
        try:
            refused = run.on_signal(signal)
        except ValidationError:
            refused = "invalid data"
        if not refused:
            self.commit(run)
        return not refused

    def event_key(self, event: Settled) -> str | None:
        """The key ``event`` carries for the wait step the saga is at (the orchestrator's
        question), None when it is at no wait for an event."""
        step = self.saga.step(self.record.step) if self.record.step else None
        return step.key_of_event(event) if isinstance(step, WaitStep) else None

    def follow(self, result: TransitionResult, in_doubt: str | None) -> None:
        """Feed the reference what the transition did, in the order it did it."""
        ref = self.reference
        compensates = (
            result.record.status in COMPENSATING and self.record.status not in COMPENSATING
        )
        local_undos = [(step, ok) for step, compensation, ok in self.ran if compensation]
        logged_undos = []
        for entry in result.log:
            if entry.phase is Phase.FORWARD:
                if entry.outcome == "succeeded":
                    ref.effect(entry.step)
                elif entry.step == in_doubt and compensates:
                    ref.effect(entry.step, certain=False)
                continue
            if self.saga.step(entry.step).kind == "local":
                logged_undos.append((entry.step, entry.outcome == "succeeded"))
            if entry.outcome == "succeeded":
                ref.compensated(entry.step)
            else:
                ref.compensating(entry.step)
        assert logged_undos == local_undos, (
            "the step log disagrees with the local compensations run"
        )
        for message in result.outgoing:
            if COMPENSATES_HEADER in message.envelope.headers:
                ref.compensating(message.envelope.headers[STEP_HEADER])
        if result.record.status is SagaStatus.COMPENSATED:
            assert ref.next_to_undo() is None, f"compensated with {ref.took_effect} still standing"

    def check_messages(self, result: TransitionResult) -> None:
        """Every request carries its step's key; a retry of a step keeps the same one."""
        for message in result.outgoing:
            envelope = message.envelope
            step = envelope.headers[STEP_HEADER]
            key = f"{SAGA_ID}:{step}"
            if message.destination == HOME:
                assert envelope.type in CONTROL
            elif COMPENSATES_HEADER in envelope.headers:
                assert envelope.headers[IDEMPOTENCY_KEY_HEADER] == f"{key}:compensation"
                assert envelope.headers[COMPENSATES_HEADER] == key
                assert envelope.payload == {"step": step}
            else:
                assert envelope.headers[IDEMPOTENCY_KEY_HEADER] == key
                assert envelope.payload == {"step": step} and envelope.reply_to == HOME

    def deliver_reply(self, request: Envelope, outcome: str, faults: list[bool]) -> None:
        reply = model_reply(request, outcome)
        envelope = reply_envelope(request, reply, self.new_id())
        if request not in self.answered:
            self.answered.append(request)
        if not awaits_reply(self.record, envelope):
            self.late_reply(reply, envelope)
            return
        run = self.transition(envelope, faults)
        if isinstance(reply, FailureReply):
            forward = self.record.status is not SagaStatus.COMPENSATING
            in_doubt = outcome in (DEAD_LETTERED, PURGED) and forward
            run.on_failure(reply)
            self.commit(run, request.headers[STEP_HEADER] if in_doubt else None)
        else:
            run.on_success(reply)
            self.commit(run)

    def late_reply(self, reply: BaseModel, envelope: Envelope) -> None:
        """A reply the saga does not wait for: nothing changes, but a late success is undone,
        its compensation awaited like any other (so the model's failures reach it too)."""
        before = _snapshot(self.record)
        step = envelope.headers[STEP_HEADER]
        if may_undo(reply, envelope):
            run = self.transition(envelope, [])
            if run.undo_late_success(step, reply):
                assert self.record.status in COMPENSATING
                assert step not in self.reference.took_effect, f"{step} is still to undo in order"
                self.reference.late_effect(step)
                result = self.commit(run)
                assert not result.dead_letters
                assert step in self.record.completed_steps, f"{step} is not to be undone"
                return
        assert _snapshot(self.record) == before, "a late reply changed the saga"

    def fire(self, envelope: Envelope, faults: list[bool]) -> None:
        """Deliver a timer, deadline or wait timeout (each at most once: the inbox sees to it)."""
        self.scheduled.remove(envelope)
        message = CONTROL[envelope.type].model_validate(envelope.payload)
        run = self.transition(envelope, faults)
        if isinstance(message, StepTimer):
            if awaits(self.record, envelope.message_id):  # else StaleReply: retried, dead-lettered
                run.on_timer(message)
                self.commit(run)
        elif isinstance(message, WaitTimeout):
            if wait_timeout_applies(self.record, envelope):  # else ignored: a signal won
                run.on_wait_timeout()
                self.commit(run)
        else:
            assert isinstance(message, StepDeadline)
            if deadline_applies(self.record, message):
                run.on_deadline(message)
                result = self.commit(run, message.step)
                retried = [m.envelope for m in result.outgoing if m.destination != HOME]
                if result.record.status is SagaStatus.RUNNING and retried:
                    assert [e.message_id for e in retried] == [message.awaited]

    # -- rules -------------------------------------------------------------------------

    @initialize(shapes=saga_shapes(), faults=st.lists(st.booleans(), max_size=3))
    def start(self, shapes: tuple[StepShape, ...], faults: list[bool]) -> None:
        self.saga = build(shapes, self.faults, self.ran)
        pivot = next((s.name for s in shapes if s.pivot), None)
        self.reference = Reference({s.name for s in shapes if s.compensated}, pivot)
        self.record = SagaRecord.new(SAGA_ID, "model", 1, HOME, Data().model_dump())
        run = self.transition(None, faults)
        run.advance(0)
        self.commit(run)

    def pending_request(self) -> Envelope | None:
        return next((r for r in self.requests if awaits(self.record, r.message_id)), None)

    def pending_timer(self) -> Envelope | None:
        return next((t for t in self.scheduled if awaits(self.record, t.message_id)), None)

    @precondition(lambda self: self.pending_request() is not None)
    @rule(outcome=st.sampled_from(OUTCOMES), faults=st.lists(st.booleans(), max_size=3))
    def reply_to_pending(self, outcome: str, faults: list[bool]) -> None:
        request = self.pending_request()
        assert request is not None
        self.deliver_reply(request, outcome, faults)

    @precondition(lambda self: bool(self.requests))
    @rule(pick=st.integers(0, 20), outcome=st.sampled_from([*OUTCOMES, STEP_CLOSED]))
    def reply_to_any(self, pick: int, outcome: str) -> None:
        """A reply to an earlier request: stale, or an answer to one that was replayed."""
        self.deliver_reply(self.requests[pick % len(self.requests)], outcome, [])

    @precondition(lambda self: bool(self.answered))
    @rule(pick=st.integers(0, 20), outcome=st.sampled_from(OUTCOMES))
    def duplicate_reply(self, pick: int, outcome: str) -> None:
        """Another reply to a request that was answered already (a replayed dead letter)."""
        self.deliver_reply(self.answered[pick % len(self.answered)], outcome, [])

    @precondition(lambda self: self.pending_timer() is not None)
    @rule(faults=st.lists(st.booleans(), max_size=3))
    def timer_fires(self, faults: list[bool]) -> None:
        timer = self.pending_timer()
        assert timer is not None
        self.fire(timer, faults)

    @precondition(lambda self: bool(self.scheduled))
    @rule(pick=st.integers(0, 20), faults=st.lists(st.booleans(), max_size=3))
    def any_timer_fires(self, pick: int, faults: list[bool]) -> None:
        self.fire(self.scheduled[pick % len(self.scheduled)], faults)

    @rule(
        event=st.sampled_from(["go", "other"]),
        ok=st.booleans() | st.just("not a bool"),
        faults=st.lists(st.booleans(), max_size=3),
    )
    def signal(self, event: str, ok: bool | str, faults: list[bool]) -> None:
        self.apply_signal(Signal(saga_id=SAGA_ID, event=event, data={"ok": ok}), faults)

    @rule(mine=st.booleans(), ok=st.booleans(), faults=st.lists(st.booleans(), max_size=3))
    def publish(self, mine: bool, ok: bool, faults: list[bool]) -> None:
        """A Settled event is published, for this saga's order or another: it ends the wait
        of a saga waiting for it under its key, or is kept."""
        event = Settled(order=Data().order if mine else "o-other", ok=ok)
        if awaits_event(self.record, SETTLED, self.event_key(event)):
            self.apply_signal(
                Signal(saga_id=SAGA_ID, event=SETTLED, data=event.model_dump()), faults
            )
        else:
            self.waits.park(None, SETTLED, [event.order], self.new_id(), event.model_dump())

    @rule()
    def cancel(self) -> None:
        """What the store's cancel does in SQL: flag a running saga short of its pivot."""
        record = self.record
        if record.status is SagaStatus.RUNNING and not record.pivot_reached:
            record.cancel_requested = True
            record.last_error = "cancelled: by the model"
            record.version += 1
            self.reference.cancelled = True

    @rule(faults=st.lists(st.booleans(), max_size=3))
    def resume(self, faults: list[bool]) -> None:
        run = self.transition(None, faults)
        if run.resume():
            self.commit(run)

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def settled_or_movable(self) -> None:
        """Nothing pending means finished or an operator's turn; something pending can arrive."""
        record = self.record
        assert isinstance(record.status, SagaStatus)
        if record.pending_message_id is None:
            assert record.status.finished or record.status.needs_operator, record.status
            return
        assert not record.status.finished, f"{record.status} yet waiting"
        ways = {r.message_id for r in self.requests} | {t.message_id for t in self.scheduled}
        assert record.pending_message_id in ways or record.waiting_for is not None, (
            f"stranded: {record.status} at {record.step} waits for a message nobody will send"
        )

    @invariant()
    def keyed_while_waiting_for_an_event(self) -> None:
        """A saga at a wait for a published event waits under its data's key, and never
        while an event for that key is kept; at any other point it has no key."""
        record = self.record
        step = (
            self.saga.step(record.step) if getattr(self, "record", None) and record.step else None
        )
        waiting = record.waiting_for is not None and isinstance(step, WaitStep)
        if waiting and step is not None and step.correlate is not None:
            assert record.wait_key == Data().order, record
            assert all(e["order"] != record.wait_key for e in self.early), "waits, event kept"
        else:
            assert record.wait_key is None, record

    @invariant()
    def pivot_and_cancel_hold(self) -> None:
        if self.reference.pivot_passed:
            assert self.record.status not in COMPENSATING, "compensating after the pivot completed"
        if self.reference.cancelled:
            assert self.record.status is not SagaStatus.COMPLETED, "a cancelled saga completed"
            assert not self.reference.pivot_passed, "a cancelled saga went past its pivot"

    def teardown(self) -> None:
        """A cooperative world answers what the saga waits for, and an operator resumes it
        when it stops: it must finish."""
        if not hasattr(self, "record") or sys.exc_info()[0] is not None:
            return  # not started, or a check already failed: nothing more to learn
        resumes = 0
        for _ in range(80):
            if self.record.status.finished:
                return
            request, timer = self.pending_request(), self.pending_timer()
            if self.record.status.needs_operator and resumes < 3:
                resumes += 1  # the operator fixed the cause and resumes the saga
                self.resume([])
            elif self.record.waiting_for == SETTLED:
                self.publish(True, True, [])
            elif self.record.waiting_for is not None:
                self.signal("go", True, [])
            elif request is not None:
                self.deliver_reply(request, "ok", [])
            else:
                assert timer is not None, "stranded"
                self.fire(timer, [])
            self.settled_or_movable()
            self.pivot_and_cancel_hold()
        raise AssertionError(f"saga never came to rest: {self.record}")


TestTransitionModel = SagaMachine.TestCase
TestTransitionModel.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


# -- what the model found, kept as plain regression tests ------------------------------------


def _machine(*shapes: StepShape) -> SagaMachine:
    machine = SagaMachine()
    machine.start(shapes, [])
    return machine


def test_a_cancel_while_waiting_compensates_when_the_event_arrives() -> None:
    machine = _machine(
        StepShape("approval", "wait"), StepShape("charge", "remote", compensated=True, pivot=True)
    )
    machine.cancel()
    machine.signal("go", True, [])
    assert machine.record.status is SagaStatus.COMPENSATED
    assert machine.requests == []  # the pivot was never sent


def test_a_cancel_while_waiting_compensates_when_the_wait_times_out() -> None:
    machine = _machine(
        StepShape("approval", "wait", timeout="ship"),
        StepShape("reserve", "remote"),
        StepShape("ship", "remote"),
    )
    machine.cancel()
    timeout = machine.pending_timer()
    assert timeout is not None
    machine.fire(timeout, [])
    assert machine.record.status is SagaStatus.COMPENSATED
    assert machine.requests == []


def test_a_wait_after_the_pivot_refuses_an_event_it_fails_on_and_keeps_waiting() -> None:
    machine = _machine(StepShape("book", "local", pivot=True), StepShape("approval", "wait"))
    machine.signal("go", False, [])  # on_event raises StepFailed
    assert machine.record.status is SagaStatus.RUNNING
    assert machine.record.waiting_for == "go"
    machine.signal("go", True, [])
    assert machine.record.status is SagaStatus.COMPLETED


def test_an_event_published_before_its_wait_ends_the_wait_as_it_begins() -> None:
    machine = _machine(StepShape("charge", "remote"), StepShape("settled", "wait", keyed=True))
    machine.publish(False, True, [])  # another order's: kept, never this saga's
    machine.publish(True, True, [])  # this saga's, while it still waits for its reply: kept
    assert len(machine.early) == 2
    request = machine.pending_request()
    assert request is not None
    machine.deliver_reply(request, "ok", [])  # the wait begins, and takes its event at once
    assert machine.record.status is SagaStatus.COMPLETED
    assert machine.early == [{"order": "o-other", "ok": True}]


def test_a_wait_for_an_event_is_keyed_and_its_key_goes_when_it_ends() -> None:
    machine = _machine(StepShape("settled", "wait", keyed=True), StepShape("ship", "remote"))
    assert (machine.record.waiting_for, machine.record.wait_key) == (SETTLED, "o-1")
    machine.publish(True, True, [])
    assert (machine.record.step, machine.record.wait_key) == ("ship", None)


def test_a_wait_past_the_pivot_refusing_a_kept_event_is_offered_the_next_one() -> None:
    machine = _machine(
        StepShape("charge", "remote", pivot=True),
        StepShape("ship", "remote"),
        StepShape("settled", "wait", keyed=True),
    )
    machine.reply_to_pending("ok", [])  # the pivot took effect: the wait can only go forward
    machine.publish(True, False, [])  # this order's, kept; on_event will refuse it
    machine.publish(True, False, [])  # again: kept behind the first
    machine.reply_to_pending("ok", [])  # the wait begins and is offered both, oldest first
    assert (machine.record.waiting_for, machine.record.wait_key) == (SETTLED, "o-1")
    assert machine.early == []  # each refused and dropped, none kept while the saga waits
    machine.keyed_while_waiting_for_an_event()


def test_a_kept_event_after_one_the_wait_refuses_ends_the_wait() -> None:
    machine = _machine(
        StepShape("charge", "remote", pivot=True), StepShape("settled", "wait", keyed=True)
    )
    machine.publish(True, False, [])
    machine.publish(True, True, [])
    machine.reply_to_pending("ok", [])  # the first is refused, the second ends the wait
    assert machine.record.status is SagaStatus.COMPLETED
    assert machine.early == []
