"""Model-based tests of fan-outs: items answered in any order, next to a parallel group.

Hypothesis draws a saga with a fan-out (one to five items, a cap of one to three, its
items compensated or not), maybe a step before it, maybe a parallel group (members with
or without deadlines) before it or holding it as a member, maybe a step after it, then
plays the participant as the parallel-group model does (answers in any order,
duplicates, dead letters, deadlines, compensations that fail and are retried on the
saga's timers or given up on until a resume, a late success's too). What it counts is
each command's idempotency key, so every item is a unit of its own.

After every event nothing is undone twice, nothing is undone that did not take effect
(or may have), every compensation sent is awaited, and no item's compensation goes out
under a new message id but after a failure of its last one or a resume (an item sent
twice at once would); at the end the saga has completed (nothing undone) or
compensated, with every item and step that took effect undone exactly once (in a group,
an item whose success came after a sibling failed included).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from uuid import UUID

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from saga import Saga, StepRetry
from saga.engine.definition import COMPENSATE, RETRY
from saga.engine.staleness import awaits
from saga.engine.transitions import Transition
from saga.messaging.envelope import COMPENSATES_HEADER, IDEMPOTENCY_KEY_HEADER, Envelope
from tests.support.saga_model import SAGA_ID, Command, Data, Undo
from tests.unit.test_parallel_model import GroupMachine, Member


@dataclass(frozen=True)
class FanShape:
    """The generated saga, as Hypothesis prints it when it reports a failure."""

    before: bool
    group: tuple[Member, ...]  # empty: no group
    in_group: bool  # the fan-out is a member of the group (else it comes after it)
    items: int
    cap: int
    compensated: bool
    after: bool

    @property
    def members(self) -> tuple[Member, ...]:
        """What the group model reads for deadlines."""
        return self.group


@st.composite
def fan_shapes(draw: st.DrawFn) -> FanShape:
    in_group = draw(st.booleans())
    group = tuple(
        Member(
            name=f"m{i}",
            compensated=draw(st.booleans()),
            deadline=draw(st.sampled_from([None, None, RETRY, COMPENSATE])),
        )
        for i in range(draw(st.sampled_from([1, 2] if in_group else [0, 0, 2])))
    )
    return FanShape(
        before=draw(st.booleans()),
        group=group,
        in_group=in_group,
        items=draw(st.integers(min_value=1, max_value=5)),
        cap=draw(st.integers(min_value=1, max_value=3)),
        compensated=draw(st.booleans()) or draw(st.booleans()),
        after=draw(st.booleans()),
    )


def key(step: str) -> str:
    return f"{SAGA_ID}:{step}"


class FanOutMachine(GroupMachine):
    """One saga with a fan-out, moved by Transition and the routing rules."""

    def __init__(self) -> None:
        super().__init__()
        self.failed_undos: Counter[str] = Counter()  # failed compensations, per unit
        self.resumes = 0  # a resume sends an item's compensation under a new id at most once

    def commit(self, run: Transition) -> None:
        """Every compensation the saga sends it awaits (a late success's, a step's or an
        item's, included): one sent and forgotten could fail unseen."""
        sent = len(self.requests)
        super().commit(run)
        for request in self.requests[sent:]:
            if COMPENSATES_HEADER in request.headers:
                assert awaits(self.record, request.message_id), f"{self.unit(request)} unawaited"

    def is_item(self, request: Envelope) -> bool:
        return ":fan:" in self.unit(request)

    def undo_failed(self, request: Envelope) -> None:
        self.failed_undos[self.unit(request)] += 1

    def check_undos(self) -> None:
        super().check_undos()
        sent: defaultdict[str, set[UUID]] = defaultdict(set)
        for request in self.requests:
            if COMPENSATES_HEADER in request.headers and self.is_item(request):
                sent[self.unit(request)].add(request.message_id)
        for unit, ids in sent.items():
            allowed = 1 + self.failed_undos[unit] + self.resumes
            assert len(ids) <= allowed, f"{unit} compensated {len(ids)}x, {allowed} allowed"

    @rule()
    def resume(self) -> None:
        self.resumes += 1
        super().resume()

    def unit(self, request: Envelope) -> str:
        """The forward key a request carries, or the one a compensation undoes."""
        headers = request.headers
        return headers.get(COMPENSATES_HEADER) or headers[IDEMPOTENCY_KEY_HEADER]

    def unit_of(self, step: str) -> str:
        return key(step)

    def build_fan_out(self, shape: FanShape) -> Saga[Data]:
        saga = Saga("model", data=Data, retry=StepRetry(attempts=2))
        if shape.before:
            self.remote(saga, Member("before"))
        if shape.in_group:
            with saga.parallel("group"):
                self.remote(saga, shape.group[0])
                self.fan_out(saga, shape)
                for member in shape.group[1:]:
                    self.remote(saga, member)
        else:
            if shape.group:
                with saga.parallel("group"):
                    for member in shape.group:
                        self.remote(saga, member)
            self.fan_out(saga, shape)
        if shape.after:
            self.remote(saga, Member("after"))
        return saga

    def fan_out(self, saga: Saga[Data], shape: FanShape) -> None:
        saga.for_each(
            "fan",
            items=lambda d: [f"i{n}" for n in range(shape.items)],
            service="participant",
            command=lambda d, item: Command(step=item),
            compensate=(lambda d, item: Undo(step=item)) if shape.compensated else None,
            max_in_flight=shape.cap,
            key=lambda item: item,
        )

    @initialize(shape=fan_shapes())
    def start(self, shape: FanShape) -> None:
        self.shape = shape  # type: ignore[assignment]
        items = {key(f"fan:{n}:i{n}") for n in range(shape.items)} if shape.compensated else set()
        members = {key(m.name) for m in shape.group if m.compensated}
        self.compensated = items | members | {key("before"), key("after")}
        self.begin(self.build_fan_out(shape))


TestFanOutModel = FanOutMachine.TestCase
TestFanOutModel.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)
