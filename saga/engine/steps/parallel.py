"""A parallel group: steps started together, the saga going on once all have answered.

Every member starts in the transition that reaches the group (local members run there
and then, every remote member's command leaves in that transaction). While they are out,
the group's part of the record (:attr:`SagaRecord.step_state`) keeps each member's
pending message and attempt; ``awaits`` lists the messages the saga waits for, so a
reply to any member is the saga's business. The record's ``step`` stays the group.

A member that succeeds joins the completed steps under its own name, so compensation
undoes members one by one, latest first, with their own compensations. A member that
fails makes the saga compensate at once: the members that succeeded and the steps before
the group, in reverse order. A sibling still out then is no longer awaited: if its
success comes later, the late-success path undoes it; if it fails, nothing took effect.
Members keep their own deadlines (retry under the same message id, or compensate with
that member in doubt) and ``on_dead_letter="compensate"``.

A fan-out may be a member too: its first ``max_in_flight`` commands leave with the other
members', its state (one mark per item, its messages out, its items' digest) sits under
its name in ``members``, and every item message still out is in ``awaits`` as well. It
joins the completed steps with its first item that took effect (so a sibling failing
later undoes its items), moves to their end when every item succeeded (so members are
undone in the order they succeeded), and fails the group when one item fails. When the
group fails, what each fan-out member needs to undo its items (and the items still out,
whose late successes are undone) is kept under ``members`` while the saga compensates; a
fan-out member undoing its items keeps its compensation's state there too (its marks, and
up to ``max_in_flight`` item compensations out in its own ``awaits``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pydantic import BaseModel

from saga.engine.reply_joins import join_replies
from saga.engine.state import Phase, SagaStatus
from saga.engine.steps.for_each import ForEach
from saga.engine.steps.kind import StepKind, StepShape
from saga.engine.steps.local import LocalStep
from saga.engine.steps.options import Condition
from saga.engine.steps.remote import RemoteStep
from saga.errors import StaleReply
from saga.messaging.control import DEAD_LETTERED, PURGED, FailureReply, StepDeadline

if TYPE_CHECKING:
    from saga.engine.definition import Saga
    from saga.engine.transitions import Transition

#: What a group may hold.
Member = LocalStep | RemoteStep | ForEach


@dataclass(frozen=True, slots=True)
class ParallelGroup(StepKind):
    """Steps started together; the saga goes on when every one of them has answered."""

    name: str
    members: tuple[Member, ...]
    when: Condition | None = None
    pivot: bool = False
    retry: None = None
    compensation: None = None

    kind = "parallel"

    def member(self, name: str) -> Member | None:
        return next((m for m in self.members if m.name == name), None)

    def parts(self) -> tuple[StepKind, ...]:
        return (self, *self.members)

    # -- moving forward --------------------------------------------------------

    def begin(self, t: Transition) -> bool:
        record = t.record
        record.step_state = {"awaits": [], "members": {}}
        record.step_started_at = t.at
        record.step = self.name  # what a member failing now compensates from
        for member in self.members:
            if member.when is not None and not member.when(t.data):
                t.log_step(member, Phase.FORWARD, "skipped", t.at, attempt=1)
                continue
            if isinstance(member, ForEach):
                self._start_fan_out(t, member)
            elif not member.begin(t) and record.status is SagaStatus.RUNNING:
                self._capture(t, member)
            if record.status is not SagaStatus.RUNNING:
                return False  # a member failed: the saga compensates (the others are out)
        if record.step_state["awaits"]:
            join_replies(t.outgoing, record.step_state["awaits"])
            self._settle(t)
            return False
        record.step_state = {}
        return True

    def _start_fan_out(self, t: Transition, member: ForEach) -> None:
        state = member.start_items(t)
        if state is not None:
            t.record.step_state["members"][member.name] = state
            t.record.step_state["awaits"].extend(state["awaits"])
            self._settle(t)

    def resend(self, t: Transition, attempt: int, message_id: UUID | None = None) -> bool:
        """Send every member still out again, under its own message id (a resume)."""
        state = t.record.step_state
        if not state.get("awaits"):
            return False
        for name, entry in list(state["members"].items()):
            member = self.member(name)
            assert member is not None
            if isinstance(member, ForEach):
                member.resend_items(t, entry)
            elif entry["message"] in state["awaits"]:
                member.resend(t, entry["attempt"], UUID(entry["message"]))
                self._capture(t, member)
        self._settle(t)
        return True

    def _settle(self, t: Transition) -> None:
        """The saga waits at the group; its pending message is the first one still out (so
        it shows as waiting, and a resume sends the members still out again)."""
        record = t.record
        record.step = self.name
        record.pending_message_id = UUID(record.step_state["awaits"][0])
        record.step_attempt = 1

    def _capture(self, t: Transition, member: LocalStep | RemoteStep) -> None:
        """Keep what a member just sent (its pending message) in the group's state and put
        the saga back at the group."""
        record = t.record
        if record.step != member.name or record.pending_message_id is None:
            return
        state = record.step_state
        entry = state["members"].get(member.name)
        if entry is not None and entry["message"] in state["awaits"]:
            state["awaits"].remove(entry["message"])
        message = str(record.pending_message_id)
        state["members"][member.name] = {"message": message, "attempt": record.step_attempt}
        state["awaits"].append(message)
        self._settle(t)

    def _answered(self, t: Transition, message_id: UUID | None) -> tuple[Member, dict[str, Any]]:
        """The member whose message (or item's message) ``message_id`` answers, now no
        longer awaited, and its entry in the group's state."""
        state = t.record.step_state
        message = str(message_id)
        if message in state["awaits"]:
            for name, entry in state["members"].items():
                if entry.get("message") == message or message in entry.get("awaits", ()):
                    state["awaits"].remove(message)
                    member = self.member(name)
                    assert member is not None
                    t.record.step_attempt = entry.get("attempt", 1)
                    t.record.pending_message_id = message_id
                    return member, entry
        raise StaleReply(f"group {self.name!r} awaits no message {message_id}")

    def take_success(self, t: Transition, reply: BaseModel) -> None:
        state = t.record.step_state
        member, entry = self._answered(t, t.cause.causation_id if t.cause else None)
        if isinstance(member, ForEach):
            done = member.take_item_success(t, entry, reply)
            state["awaits"].extend(m for m in entry["awaits"] if m not in state["awaits"])
            if member.name not in t.record.completed_steps:
                t.record.completed_steps.append(member.name)  # its first item took effect
            if done:  # undone, as members are, in the order they succeeded
                t.log_step(member, Phase.FORWARD, "succeeded", t.record.step_started_at)
                t.record.completed_steps.remove(member.name)
                t.record.completed_steps.append(member.name)
                del state["members"][member.name]
        else:
            member.take_reply(t, reply)
            t.log_step(member, Phase.FORWARD, "succeeded", t.record.step_started_at)
            t.record.completed_steps.append(member.name)
        if state["awaits"]:
            self._settle(t)
        else:
            t.record.step_state = {}
            t.record.step = self.name
            t.go_on(t.saga.index(self.name) + 1)

    def take_failure(self, t: Transition, failure: FailureReply) -> None:
        # the compensation keeps what the fan-out members need (kept_for_compensation);
        # siblings still out are no longer awaited
        member, entry = self._answered(t, t.cause.causation_id if t.cause else None)
        if isinstance(member, ForEach):
            reason = member.take_item_failure(t, entry, failure)
            if member.took_effect(entry) and member.name not in t.record.completed_steps:
                t.record.completed_steps.append(member.name)  # an item in doubt
            t.begin_compensation(reason, member)
            return
        reason = f"{member.name}: {failure.reason}"
        t.log_step(member, Phase.FORWARD, "failed", t.record.step_started_at, reason)
        if failure.code in (DEAD_LETTERED, PURGED):
            t.compensate_in_doubt(member, reason)
        else:
            t.begin_compensation(reason, member)

    def take_deadline(self, t: Transition, deadline: StepDeadline) -> None:
        member, _ = self._answered(t, deadline.awaited)
        member.take_deadline(t, deadline)
        if t.record.status is SagaStatus.RUNNING and not isinstance(member, ForEach):
            self._capture(t, member)  # sent again under the same message id

    # -- compensating ----------------------------------------------------------

    def compensate(self, t: Transition, attempt: int, message_id: UUID | None = None) -> bool:
        return True  # its members are compensated one by one, under their own names

    def kept_for_compensation(self, state: dict[str, Any]) -> dict[str, Any]:
        """What each member needs to be undone (a fan-out: its items' marks, and its items
        still out), under ``members``."""
        kept: dict[str, Any] = {}
        for name, entry in state.get("members", {}).items():
            member = self.member(name)
            if member is not None and (needed := member.kept_for_compensation(entry)):
                kept[name] = needed
        return {"members": kept} if kept else {}

    # -- registration ----------------------------------------------------------

    def shape(self) -> StepShape:
        return {**StepKind.shape(self), "members": [m.shape() for m in self.members]}

    def expects(self) -> tuple[type[BaseModel], ...]:
        return tuple(reply for member in self.members for reply in member.expects())

    def joined_replies(self) -> tuple[StepKind, ...]:
        answering = tuple(m for m in self.members if isinstance(m, RemoteStep | ForEach))
        several = len(answering) > 1 or any(isinstance(m, ForEach) for m in answering)
        return answering if several else ()

    def problems(
        self, saga: Saga[Any], index: int, routes: dict[type[BaseModel], str]
    ) -> list[str]:
        where = f"parallel group {self.name!r}"
        problems: list[str] = []
        if not self.members:
            problems.append(f"{where} has no members")
        pivot = saga.pivot_index
        if pivot is not None and index > pivot:
            problems.append(
                f"{where} comes after the pivot {saga.steps[pivot].name!r}: a group's members "
                "are compensated when one fails, which the steps after the pivot never are"
            )
        for member in self.members:
            if member.pivot:
                problems.append(
                    f"{where}: member {member.name!r} is marked pivot; a pivot may not sit "
                    "inside a group (its siblings could still fail); make it a step of its "
                    "own before or after the group"
                )
            if member.holds_dead_letters:
                problems.append(
                    f"{where}: member {member.name!r} has on_dead_letter='hold', which a "
                    "group member cannot do (its siblings go on); use 'compensate'"
                )
            problems.extend(member.problems(saga, index, routes))
        return problems
