"""Model-based tests of parallel groups: members answered in any order, against a participant.

Hypothesis draws a saga with a parallel group (remote and local members, some compensated,
some with deadlines, a local member that may fail), maybe a step before it and one after,
then answers the saga's requests in any order (success, business failure, dead letter),
answers some twice, fires deadlines and retry timers, and resumes the saga (sending again
what it waits for). The participant keeps the first outcome of each command and
compensation (as its inbox would) and applies each compensation key once, counting them;
compensations fail too (business failures, dead letters), a late member's as well.

After every event nothing is undone twice, and nothing is undone that did not take effect
(or may have: a dead-lettered command, a deadline given up on). At the end a cooperative
world answers everything still out and an operator resumes a saga that gave up on a
compensation; the saga must have completed (nothing undone) or compensated, with every
step that took effect undone exactly once.
"""

from __future__ import annotations

import copy
import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from saga import Saga, StepRetry
from saga.engine.definition import COMPENSATE, RETRY
from saga.engine.staleness import awaits, awaits_reply, deadline_applies, may_undo
from saga.engine.state import SagaRecord, SagaStatus
from saga.engine.transitions import Transition
from saga.errors import StepFailed
from saga.messaging.control import DEAD_LETTERED, FailureReply, StepDeadline, StepTimer
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
    MemorySteps,
    Undo,
    model_reply,
    reply_envelope,
)

OUTCOMES = ["ok", "failed", DEAD_LETTERED]
DEADLINE = message_type_of(StepDeadline)
TIMER = message_type_of(StepTimer)


@dataclass(frozen=True)
class Member:
    """One member of the generated group, as Hypothesis prints it when it reports a failure."""

    name: str
    local: bool = False
    compensated: bool = True
    deadline: str | None = None  # None, RETRY or COMPENSATE
    fails: bool = False  # a local member that raises StepFailed


@dataclass(frozen=True)
class Shape:
    before: bool
    members: tuple[Member, ...]
    after: bool


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    count = draw(st.integers(min_value=2, max_value=4))
    members = []
    for i in range(count):
        local = draw(st.booleans()) and i > 0
        members.append(
            Member(
                name=f"m{i}",
                local=local,
                compensated=draw(st.booleans()) or draw(st.booleans()),
                deadline=None if local else draw(st.sampled_from([None, RETRY, COMPENSATE])),
                fails=local and draw(st.booleans()) and draw(st.booleans()),
            )
        )
    return Shape(draw(st.booleans()), tuple(members), draw(st.booleans()))


class GroupMachine(RuleBasedStateMachine):
    """One saga with a parallel group, moved by Transition and the routing rules."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: Iterator[int] = itertools.count(100)
        self.clock = datetime(2025, 1, 1, tzinfo=UTC)
        self.requests: list[Envelope] = []  # commands and compensations sent
        self.deadlines: list[Envelope] = []
        self.timers: list[Envelope] = []  # retry timers the saga sent itself
        self.outcome: dict[UUID, str] = {}  # the first outcome of each command (its inbox)
        self.took_effect: list[str] = []
        self.in_doubt: set[str] = set()  # may have taken effect
        self.undone: Counter[str] = Counter()
        self.applied_undos: set[str] = set()  # compensation keys applied
        self.undo_outcome: dict[UUID, str] = {}  # the first outcome of each compensation

    def new_id(self) -> UUID:
        return UUID(int=next(self.ids))

    # -- the saga -----------------------------------------------------------------

    def build(self, shape: Shape) -> Saga[Data]:
        saga = Saga("model", data=Data, retry=StepRetry(attempts=2))
        if shape.before:
            self.remote(saga, Member("before"))
        with saga.parallel("group"):
            for member in shape.members:
                if member.local:
                    self.local(saga, member)
                else:
                    self.remote(saga, member)
        if shape.after:
            self.remote(saga, Member("after"))
        return saga

    def remote(self, saga: Saga[Data], member: Member) -> None:
        name = member.name
        saga.remote(
            name,
            service="participant",
            command=lambda d, n=name: Command(step=n),
            compensate=(lambda d, n=name: Undo(step=n)) if member.compensated else None,
            deadline=timedelta(seconds=30) if member.deadline else None,
            on_deadline=member.deadline or RETRY,
        )

    def local(self, saga: Saga[Data], member: Member) -> None:
        def action(tx: object, data: Data) -> None:
            if member.fails:
                raise StepFailed(f"{member.name} failed by the model")
            self.took_effect.append(member.name)

        def undo(tx: object, data: Data) -> None:
            self.undone[member.name] += 1

        saga.local(member.name, compensate=undo if member.compensated else None)(action)

    # -- playing the orchestrator -------------------------------------------------------

    def transition(self, cause: Envelope | None) -> Transition:
        self.clock += timedelta(seconds=1)
        return Transition(
            self.saga,
            copy.deepcopy(self.record),  # the orchestrator loads it afresh
            cause=cause,
            at=self.clock,
            home_service=HOME,
            local_steps=MemorySteps(self.clock),
            new_id=self.new_id,
        )

    def commit(self, run: Transition) -> None:
        result = run.result()
        self.record = result.record
        for message in result.outgoing:
            envelope = message.envelope
            if envelope.type == DEADLINE:
                self.deadlines.append(envelope)
            elif envelope.type == TIMER:
                self.timers.append(envelope)
            else:
                assert message.destination != HOME, envelope.type
                self.requests.append(envelope)
        self.check_undos()

    def unit(self, request: Envelope) -> str:
        """What ``request`` does or undoes, as the model counts it: its step."""
        return request.headers[STEP_HEADER]

    def unit_of(self, step: str) -> str:
        """What the model counts for step ``step`` (its requests' :meth:`unit`)."""
        return step

    def check_undos(self) -> None:
        for request in self.requests:
            step = self.unit(request)
            if COMPENSATES_HEADER in request.headers:
                assert step in self.took_effect or step in self.in_doubt, (
                    f"{step} compensated though it took no effect ({self.took_effect})"
                )
        assert all(n <= 1 for n in self.undone.values()), f"undone twice: {self.undone}"

    @initialize(shape=shapes())
    def start(self, shape: Shape) -> None:
        self.shape = shape
        self.compensated = {m.name for m in shape.members if m.compensated} | {"before", "after"}
        self.begin(self.build(shape))

    def begin(self, saga: Saga[Data]) -> None:
        """Start one instance of ``saga``: its first transition sends what it begins with."""
        saga.validate()
        self.saga = saga
        self.record = SagaRecord.new(SAGA_ID, "model", 1, HOME, Data().model_dump())
        run = self.transition(None)
        run.advance(0)
        self.commit(run)

    def answer(self, request: Envelope, outcome: str) -> None:
        """The participant answers ``request`` (its first outcome, if it answered before)."""
        step = self.unit(request)
        undo = COMPENSATES_HEADER in request.headers
        if undo:
            first = request.message_id not in self.undo_outcome
            if first:
                self.undo_outcome[request.message_id] = self.undoes(request, outcome)
            outcome = self.undo_outcome[request.message_id]
            key = request.headers[IDEMPOTENCY_KEY_HEADER]  # the participant applies a key once
            if outcome == "ok" and key not in self.applied_undos:
                self.applied_undos.add(key)
                self.undone[step] += 1
            elif first and outcome != "ok":
                self.undo_failed(request)
        else:
            first = request.message_id not in self.outcome
            outcome = self.outcome.setdefault(request.message_id, outcome)
            if first and outcome == "ok":
                self.took_effect.append(step)
            elif first and outcome == DEAD_LETTERED:
                self.in_doubt.add(step)
        reply = model_reply(request, outcome)
        envelope = reply_envelope(request, reply, self.new_id())
        if not awaits_reply(self.record, envelope):
            if may_undo(reply, envelope):
                run = self.transition(envelope)
                if run.undo_late_success(request.headers[STEP_HEADER], reply):
                    self.commit(run)
            return
        run = self.transition(envelope)
        if isinstance(reply, FailureReply):
            run.on_failure(reply)
        else:
            run.on_success(reply)
        self.commit(run)

    def undoes(self, request: Envelope, outcome: str) -> str:
        """What a compensation answers when drawn ``outcome``: that outcome (the saga retries
        it on its timers, or gives up until a resume), a late success's compensation too."""
        return outcome

    def undo_failed(self, request: Envelope) -> None:
        """A compensation failed (the fan-out model counts them)."""

    def outstanding(self) -> list[Envelope]:
        """Requests the participant has not answered yet."""
        answered = self.outcome.keys() | self.undo_outcome.keys()
        return [r for r in self.requests if r.message_id not in answered]

    # (Rules without preconditions: one that draws from an empty list does nothing. Rules
    # that are often disabled make Hypothesis discard many examples, and find less.)

    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def answer_one_still_out(self, data: st.DataObject, outcome: str) -> None:
        if out := self.outstanding():
            self.answer(data.draw(st.sampled_from(out)), outcome)

    @rule(data=st.data())
    def answer_one_again(self, data: st.DataObject) -> None:
        """A duplicate: the participant answers again what it answered (its kept outcome)."""
        out = self.outstanding()
        if answered := [r for r in self.requests if r not in out]:
            self.answer(data.draw(st.sampled_from(answered)), "ok")

    @rule(data=st.data())
    def deadline_fires(self, data: st.DataObject) -> None:
        if not self.deadlines:
            return
        envelope = data.draw(st.sampled_from(self.deadlines))
        self.deadlines.remove(envelope)
        deadline = StepDeadline.model_validate(envelope.payload)
        if deadline_applies(self.record, deadline):
            if deadline.attempt >= 2 or self.shape_of(deadline.step).deadline == COMPENSATE:
                self.in_doubt.add(self.unit_of(deadline.step))  # given up: it may have run
            run = self.transition(envelope)
            run.on_deadline(deadline)
            self.commit(run)

    @rule(data=st.data())
    def timer_fires(self, data: st.DataObject) -> None:
        if self.timers:
            envelope = data.draw(st.sampled_from(self.timers))
            self.fire(envelope)

    def fire(self, envelope: Envelope) -> None:
        """A retry timer comes back to the saga: it acts if the saga still awaits it."""
        self.timers.remove(envelope)
        if awaits(self.record, envelope.message_id):
            run = self.transition(envelope)
            run.on_timer(StepTimer.model_validate(envelope.payload))
            self.commit(run)

    @rule()
    def resume(self) -> None:
        """An operator (or the stuck sweep) resumes the saga: what it waits for is sent again."""
        run = self.transition(None)
        if run.resume():
            self.commit(run)

    def cooperate(self) -> bool:
        """Answer every request still out with a success, fire every timer, resume a saga
        that gave up; False when there was nothing to do."""
        out = self.outstanding()
        for request in out:
            self.answer(request, "ok")
        acted = bool(out) or bool(self.timers)
        for envelope in list(self.timers):
            self.fire(envelope)
        if self.record.status is SagaStatus.COMPENSATION_FAILED:
            self.resume()
            acted = True
        return acted

    def shape_of(self, name: str) -> Member:
        return next(m for m in self.shape.members if m.name == name)

    def teardown(self) -> None:
        if not hasattr(self, "record"):
            return
        for _ in range(100):  # a cooperative world answers everything still out
            if not self.cooperate():
                break
        status = self.record.status
        assert status in (SagaStatus.COMPLETED, SagaStatus.COMPENSATED), self.record
        if status is SagaStatus.COMPLETED:
            assert not self.undone, f"completed, yet undid {self.undone}"
            return
        for step in self.took_effect:
            if step in self.compensated:
                assert self.undone[step] == 1, f"{step} took effect, undone {self.undone[step]}x"


TestGroupModel = GroupMachine.TestCase
TestGroupModel.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)
