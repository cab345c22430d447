"""A fan-out: one command per item of a list in the saga data, a capped number at a time.

When the saga reaches the step, ``items(data)`` gives the list; each item's command
leaves under an idempotency key made of the saga, the step, the item's position and its
identity (``key(item)``, or a digest of the item). At most ``max_in_flight`` commands are
out at once; each success sends the next item. ``on_reply(data, item, reply)`` gathers an
item's result into the saga data. The saga goes on once every item succeeded.

The step's part of the record (:attr:`SagaRecord.step_state`) is compact whatever the
number of items: one character per item (``marks``), the messages still out (``awaits``,
message id to position, at most the cap) and a digest of the items' identities, which must
not change while the fan-out runs (the items are read from the data again when sent or
undone).

When an item fails (or a cancel is requested) no further item is sent; once the items
still out have answered, the items that took effect (or may have: a dead-lettered command)
are compensated, latest first, ``max_in_flight`` at once: each compensation's success
sends the next, and once the last is undone the saga compensates the steps before the
fan-out. Each item's compensation retries on its own (its retry timer is awaited among the
compensations out, with its attempt); when the saga gives up on one, the others still out
are no longer awaited, and a resume sends them again. The marks say which items are being
undone (``<``) and which are undone (``-``); ``awaits`` holds each compensation out (or
retry timer) with its item's position and attempt.

A fan-out may also be a member of a parallel group (:mod:`saga.engine.steps.parallel`):
the group keeps the fan-out's state, the same three keys, under the member's name in its
own, and calls ``start_items``, ``take_item_success``, ``take_item_failure`` and
``resend_items`` with it. There the fan-out joins the completed steps with its first item
that took effect, an item that fails fails the group at once, and the items still out
then are kept (``out``: message id to position) so that a success arriving later is
undone: with the fan-out's other items if its compensation is still to come or under way;
otherwise the item is marked among the kept marks and the fan-out goes back among the
steps to undo, its compensation undoing that item alone (awaited and retried like any).
Its compensation is the one above, its state (the same marks and ``awaits``) staying
under its name in the group's ``members``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pydantic import BaseModel

from saga.db.sql import validate_name
from saga.engine.reply_joins import join_replies
from saga.engine.state import Phase, SagaStatus
from saga.engine.steps.kind import StepKind, StepShape
from saga.engine.steps.options import Condition, StepRetry
from saga.errors import ConfigurationError, StaleReply, UnexpectedReply
from saga.messaging.control import DEAD_LETTERED, PURGED, FailureReply
from saga.messaging.envelope import Envelope, message_type_of
from saga.messaging.outbox import OutgoingMessage

if TYPE_CHECKING:
    from saga.engine.definition import Saga
    from saga.engine.transitions import Transition

#: ``items(data)``: the list the fan-out runs over.
ItemsOf = Callable[[Any], Any]
#: ``command(data, item)`` / ``compensate(data, item)``: one item's message.
ItemMessage = Callable[[Any, Any], BaseModel]
#: ``on_reply(data, item, reply)``: the data with the item's result gathered into it.
ItemReducer = Callable[[Any, Any, Any], BaseModel]

logger = logging.getLogger(__name__)

# One character per item in the step's state.
TO_SEND, OUT, SUCCEEDED, FAILED, IN_DOUBT, UNDOING, UNDONE = ".>+x?<-"


@dataclass(frozen=True, slots=True)
class ForEach(StepKind):
    """One command per item of a list in the saga data, at most ``max_in_flight`` at once."""

    name: str
    items: ItemsOf
    service: str
    command: ItemMessage
    reply: type[BaseModel] | None = None
    on_reply: ItemReducer | None = None
    compensation: ItemMessage | None = None
    compensation_service: str | None = None
    max_in_flight: int = 10
    key: Callable[[Any], object] | None = None
    when: Condition | None = None
    retry: StepRetry | None = None
    pivot: bool = False

    kind = "for_each"
    sends_messages = True

    # -- the items -------------------------------------------------------------

    def _items(self, data: BaseModel) -> list[Any]:
        """The items in ``data``; raises :class:`ConfigurationError` unless they are a list."""
        try:
            items = self.items(data)
        except Exception as exc:
            raise ConfigurationError(
                f"fan-out {self.name!r}: items= failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(items, list | tuple):
            raise ConfigurationError(
                f"fan-out {self.name!r}: items= must give a list, got {type(items).__name__}"
            )
        return list(items)

    def _identity(self, item: Any) -> str:
        """What tells ``item`` apart, in its idempotency key: ``key(item)`` or a digest."""
        if self.key is not None:
            return str(self.key(item))
        value = item.model_dump(mode="json") if isinstance(item, BaseModel) else item
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def _digest(self, items: list[Any]) -> str:
        text = "\n".join(self._identity(item) for item in items)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _checked_items(self, t: Transition, state: dict[str, Any]) -> list[Any]:
        """The items, which must be the ones the fan-out began with (``state``'s digest)."""
        items = self._items(t.data)
        if self._digest(items) != state["digest"]:
            raise ConfigurationError(
                f"fan-out {self.name!r}: its items changed while it ran (on_reply or another "
                "step changed them); keep them as they are and gather results elsewhere in "
                "the data, or give key= an identity that does not change"
            )
        return items

    def _key(self, t: Transition, index: int, item: Any) -> str:
        return f"{t.envelopes.step_key(self)}:{index}:{self._identity(item)}"

    # -- moving forward --------------------------------------------------------

    def begin(self, t: Transition) -> bool:
        state = self.start_items(t)
        if state is None:  # no items (done), or items= failed (the saga compensates)
            return t.record.status is SagaStatus.RUNNING
        t.record.step_state = state
        t.record.step_started_at = t.at
        join_replies(t.outgoing, state["awaits"])
        self._settle(t, state)
        return False

    def start_items(self, t: Transition) -> dict[str, Any] | None:
        """Send the first items: the fan-out's state, or None when it has no items (it
        succeeded) or ``items=`` failed (the saga compensates)."""
        try:
            items = self._items(t.data)
        except ConfigurationError as exc:
            t.log_step(self, Phase.FORWARD, "failed", t.at, str(exc), attempt=1)
            t.begin_compensation(str(exc), self)
            return None
        if not items:
            t.log_step(self, Phase.FORWARD, "succeeded", t.at, attempt=1)
            return None
        state = {"marks": TO_SEND * len(items), "awaits": {}, "digest": self._digest(items)}
        self._send_more(t, state, items)
        return state

    def resend(self, t: Transition, attempt: int, message_id: UUID | None = None) -> bool:
        """Send every item still out again, under its own message id (a resume)."""
        if not t.record.step_state.get("awaits"):
            return False
        self.resend_items(t, t.record.step_state)
        self._settle(t, t.record.step_state)
        return True

    def resend_items(self, t: Transition, state: dict[str, Any]) -> None:
        """Send every item of ``state`` still out again, under its own message id."""
        items = self._checked_items(t, state)
        for message, index in state["awaits"].items():
            self._send(t, items, index, UUID(message))

    def _send_more(self, t: Transition, state: dict[str, Any], items: list[Any]) -> None:
        """Send items until ``max_in_flight`` are out (or none is left)."""
        marks = state["marks"]
        while len(state["awaits"]) < self.max_in_flight and (index := marks.find(TO_SEND)) >= 0:
            envelope = self._send(t, items, index, None)
            state["awaits"][str(envelope.message_id)] = index
            marks = f"{marks[:index]}{OUT}{marks[index + 1 :]}"
        state["marks"] = marks

    def _send(
        self, t: Transition, items: list[Any], index: int, message_id: UUID | None
    ) -> Envelope:
        item = items[index]
        message = self._build(t, self.command, item, "command")
        envelope = t.envelopes.request(message, self, self._key(t, index, item), message_id)
        t.outgoing.append(OutgoingMessage(envelope, self.service))
        return envelope

    def _build(self, t: Transition, builder: ItemMessage, item: Any, what: str) -> BaseModel:
        try:
            return builder(t.data, item)
        except Exception as exc:
            raise ConfigurationError(
                f"saga {t.saga.name!r} v{t.saga.version} fan-out {self.name!r}: cannot build "
                f"its {what} for an item: {type(exc).__name__}: {exc}"
            ) from exc

    def _settle(self, t: Transition, state: dict[str, Any]) -> None:
        """The saga waits at the fan-out; its pending message is the first one still out
        (``state``: the fan-out's own, at the top of the record or in its group's)."""
        record = t.record
        record.step = self.name
        awaits = state["awaits"]
        record.pending_message_id = UUID(next(iter(awaits))) if awaits else None
        record.step_attempt = 1

    def _answered(self, t: Transition, state: dict[str, Any]) -> Any:
        """What ``awaits`` kept of the message the event answers, now no longer out: the
        item's position (forward), or its position and attempt (compensation)."""
        message = str(t.cause.causation_id) if t.cause else None
        entry = state["awaits"].pop(message, None)
        if entry is None:
            raise StaleReply(f"fan-out {self.name!r} awaits no message {message}")
        t.record.pending_message_id = UUID(message)
        return entry

    def take_success(self, t: Transition, reply: BaseModel) -> None:
        state = t.record.step_state
        self._next(t, self._succeeded(t, state, int(self._answered(t, state)), reply))

    def take_item_success(self, t: Transition, state: dict[str, Any], reply: BaseModel) -> bool:
        """An item succeeded, the fan-out being a group's member (``state``: its part): send
        the next items; True when every item has succeeded."""
        items = self._succeeded(t, state, int(self._answered(t, state)), reply)
        if TO_SEND in state["marks"]:
            self._send_more(t, state, items if items is not None else self._checked_items(t, state))
        return not state["awaits"] and TO_SEND not in state["marks"]

    def _succeeded(
        self, t: Transition, state: dict[str, Any], index: int, reply: BaseModel
    ) -> list[Any] | None:
        """Mark item ``index`` succeeded and gather its reply; the items if that checked them
        (each check reads and digests every item)."""
        if self.reply is not None and not isinstance(reply, self.reply):
            raise UnexpectedReply(
                f"fan-out {self.name!r} expects {self.reply.__name__}, got {type(reply).__name__}"
            )
        _mark(state, index, SUCCEEDED)
        if self.on_reply is None:
            return None
        item = self._checked_items(t, state)[index]
        t.set_data(self.on_reply(t.data, item, reply), f"on_reply of {self.name!r}")
        return self._checked_items(t, state)  # the reducer left the items as they were

    def take_failure(self, t: Transition, failure: FailureReply) -> None:
        state = t.record.step_state
        state.setdefault("failed", self.take_item_failure(t, state, failure))
        self._next(t)

    def take_item_failure(self, t: Transition, state: dict[str, Any], failure: FailureReply) -> str:
        """An item failed (``state``: the fan-out's part of the record, or of its group's):
        mark it, and say why."""
        index = int(self._answered(t, state))
        in_doubt = failure.code in (DEAD_LETTERED, PURGED)
        _mark(state, index, IN_DOUBT if in_doubt else FAILED)
        reason = f"{self.name}[{index}]: {failure.reason}"
        t.log_step(self, Phase.FORWARD, "failed", t.record.step_started_at, reason)
        return reason

    @staticmethod
    def took_effect(state: dict[str, Any]) -> bool:
        """True when an item of ``state`` took effect (or may have: a dead letter)."""
        return SUCCEEDED in state["marks"] or IN_DOUBT in state["marks"]

    def _next(self, t: Transition, items: list[Any] | None = None) -> None:
        """After an answer: send more, go on when every item succeeded, or compensate once
        nothing is out after a failure or a cancel. ``items``: already checked for this
        answer (each check reads and digests every item)."""
        state = t.record.step_state
        stopping = "failed" in state or t.record.cancel_requested
        if not stopping and TO_SEND in state["marks"]:
            self._send_more(t, state, items if items is not None else self._checked_items(t, state))
            self._settle(t, state)
        elif state["awaits"]:
            self._settle(t, state)
        elif not stopping:
            t.log_step(self, Phase.FORWARD, "succeeded", t.record.step_started_at)
            t.record.step_state = {}
            t.record.completed_steps.append(self.name)
            t.record.step = self.name
            t.go_on(t.saga.index(self.name) + 1)
        else:
            if self.took_effect(state):
                t.record.completed_steps.append(self.name)
            t.begin_compensation(state.get("failed") or t.record.last_error or "cancelled", self)

    # -- compensating ----------------------------------------------------------

    def kept_for_compensation(self, state: dict[str, Any]) -> dict[str, Any]:
        """The marks and digest when an item took effect; and the items still out (in a
        group that failed: ``out``), whose late successes are undone; nothing without a
        compensation."""
        if self.compensation is None:
            return {}
        marks = state.get("marks", "")
        kept = {"marks": marks, "digest": state.get("digest")}
        if state.get("awaits"):
            return {**kept, "out": state["awaits"]}
        return kept if SUCCEEDED in marks or IN_DOUBT in marks else {}

    def _undo_state(self, t: Transition) -> dict[str, Any]:
        """Where the fan-out's compensation keeps its state: the saga's ``step_state``, or,
        for a group's member, its entry under the group's ``members`` there."""
        state = t.record.step_state
        if t.saga.steps[t.saga.index(self.name)].name == self.name:
            return state
        entry: dict[str, Any] = state.setdefault("members", {}).setdefault(self.name, {})
        return entry

    def _undone(self, t: Transition, state: dict[str, Any]) -> None:
        """Its compensation is over: forget its state, but for what the items still out when
        its group failed need (the marks and the digest: a late success is marked there,
        and this compensation, run again, undoes that item alone). Only its own keys: the
        saga's ``step_state`` may still hold a group's ``members`` beside them."""
        state.pop("awaits", None)
        if state.get("out"):
            return
        for key in ("marks", "digest"):
            state.pop(key, None)
        members = t.record.step_state.get("members", {})
        if members.get(self.name) is state:
            del members[self.name]
            if not members:
                del t.record.step_state["members"]

    def compensate(self, t: Transition, attempt: int, message_id: UUID | None = None) -> bool:
        """Begin undoing the items (or go on after a resume, or an item's retry timer)."""
        state = self._undo_state(t)
        if self.compensation is None:  # nothing to undo
            self._undone(t, state)
            return True
        if "marks" not in state:  # the fan-out completed: every item took effect
            items = self._items(t.data)
            state.update(marks=SUCCEEDED * len(items), digest=self._digest(items))
        awaits = state.setdefault("awaits", {})
        items = self._checked_items(t, state)
        timer = awaits.pop(str(t.cause.message_id), None) if t.cause else None
        if timer is not None:  # an item's retry timer: its compensation, again
            self._undo(t, state, items, timer[0], attempt, None)
        elif awaits:  # a resume: every item compensation still out, again, under its id
            for message, (index, sent_attempt) in list(awaits.items()):
                self._undo(t, state, items, index, sent_attempt, UUID(message))
        else:  # the first items, or a resume after giving up: those left out, again
            t.record.step_started_at = t.at
            for index in [i for i, mark in enumerate(state["marks"]) if mark == UNDOING]:
                self._undo(t, state, items, index, 1, None)
            self._undo_more(t, state, items)
        if awaits:
            self._settle(t, state)
            return False
        self._undone(t, state)
        return True

    def take_undone(self, t: Transition) -> None:
        """An item is undone: send the next, or, the last one undone, go on to the steps
        before the fan-out."""
        state = self._undo_state(t)
        _mark(state, self._undo_answered(t, state), UNDONE)
        if self._next_to_undo(state["marks"]) >= 0:
            self._undo_more(t, state, self._checked_items(t, state))
        if state["awaits"]:
            t.log_step(self, Phase.COMPENSATION, "succeeded", t.record.step_started_at)
            self._settle(t, state)
        else:
            self._undone(t, state)
            t.step_undone(self)

    def take_undo_failure(self, t: Transition, failure: FailureReply) -> None:
        """An item's compensation failed: its retry timer is awaited with the rest; once the
        saga gives up, the compensations still out are no longer awaited (a resume sends
        them again, under their keys)."""
        state = self._undo_state(t)
        index = self._undo_answered(t, state)
        attempt = t.record.step_attempt
        t.undo_failed(self, f"{self.name}[{index}]: {failure.reason}", failure.code)
        if t.record.status is SagaStatus.COMPENSATION_FAILED:
            state["awaits"].clear()
        else:
            state["awaits"][str(t.record.pending_message_id)] = [index, attempt + 1]
            self._settle(t, state)

    def _undo_answered(self, t: Transition, state: dict[str, Any]) -> int:
        """The position of the item whose compensation the event answers; the saga's
        attempt is that compensation's (for the step log and its retry)."""
        index, attempt = self._answered(t, state)
        t.record.step_attempt = attempt
        return int(index)

    @staticmethod
    def _next_to_undo(marks: str) -> int:
        """The latest item that took effect (or may have) and is not undone yet; -1: none."""
        return max(marks.rfind(SUCCEEDED), marks.rfind(IN_DOUBT))

    def _undo_more(self, t: Transition, state: dict[str, Any], items: list[Any]) -> None:
        """Send item compensations, latest item first, until ``max_in_flight`` are out."""
        marks = state["marks"]
        while (
            len(state["awaits"]) < self.max_in_flight and (index := self._next_to_undo(marks)) >= 0
        ):
            self._undo(t, state, items, index, 1, None)
            marks = f"{marks[:index]}{UNDOING}{marks[index + 1 :]}"
        state["marks"] = marks

    def _undo(
        self,
        t: Transition,
        state: dict[str, Any],
        items: list[Any],
        index: int,
        attempt: int,
        message_id: UUID | None,
    ) -> None:
        """Send item ``index``'s compensation (under ``message_id``: again), now awaited."""
        compensation = self._compensation(t, items, index, message_id)
        t.outgoing.append(compensation)
        state["awaits"][str(compensation.envelope.message_id)] = [index, attempt]

    def _compensation(
        self, t: Transition, items: list[Any], index: int, message_id: UUID | None = None
    ) -> OutgoingMessage:
        """The compensation of item ``index``, under that item's key."""
        assert self.compensation is not None
        item = items[index]
        message = self._build(t, self.compensation, item, "compensation")
        envelope = t.envelopes.undo(message, self, self._key(t, index, item), message_id)
        return OutgoingMessage(envelope, self.compensation_service or self.service)

    def undo_late(self, t: Transition, reply: BaseModel) -> bool:
        """An item still out when its group failed succeeded: mark it to be undone. If the
        fan-out's compensation is still to come (or under way), that compensation undoes it
        with the other items (False: nothing more to do); otherwise the fan-out is to be
        undone again (True), and its compensation finds that item alone to undo, the others
        being undone already or never having taken effect."""
        state = t.record.step_state.get("members", {}).get(self.name, {})
        message = str(t.cause.causation_id) if t.cause else None
        if self.compensation is None or message not in state.get("out", {}):
            return False
        index = int(state["out"].pop(message))
        items = self._checked_items(t, state)
        if self.on_reply is not None:
            t.set_data(self.on_reply(t.data, items[index], reply), f"on_reply of {self.name!r}")
        _mark(state, index, SUCCEEDED)
        again = self.name not in t.record.completed_steps
        undone = "to be undone on its own" if again else "to be undone with the other items"
        note = f"item {index} succeeded after its group failed; {undone}"
        t.log_step(self, Phase.FORWARD, "late_success", t.at, note)
        logger.warning(
            "saga %s: late success of fan-out %s item %d, %s",
            t.record.id,
            self.name,
            index,
            undone,
            extra={"saga_id": str(t.record.id), "step": self.name},
        )
        return again

    # -- registration ----------------------------------------------------------

    def shape(self) -> StepShape:
        reply = message_type_of(self.reply) if self.reply is not None else None
        return {**StepKind.shape(self), "reply": reply, "keyed": self.key is not None}

    def expects(self) -> tuple[type[BaseModel], ...]:
        return (self.reply,) if self.reply is not None else ()

    def joined_replies(self) -> tuple[StepKind, ...]:
        return (self,)  # its first items answer at about the same time

    def problems(
        self, saga: Saga[Any], index: int, routes: dict[type[BaseModel], str]
    ) -> list[str]:
        where = f"fan-out {self.name!r}"
        problems: list[str] = []
        cap = self.max_in_flight
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            problems.append(f"{where}: max_in_flight must be a whole number >= 1, not {cap!r}")
        pivot = saga.pivot_index
        if pivot is not None and index > pivot:
            problems.append(
                f"{where} comes after the pivot {saga.steps[pivot].name!r}: a fan-out's items "
                "are compensated when one fails, which the steps after the pivot never are"
            )
        if self.on_reply is not None and self.reply is None:
            problems.append(f"{where}: on_reply= needs reply= (the type each item answers with)")
        services = {"service": self.service, "compensate_service": self.compensation_service}
        for option, service in services.items():
            if service is None:
                continue
            try:
                validate_name(service, "service name")
            except ConfigurationError as exc:
                problems.append(f"{where}: {option}: {exc}")
        return problems


def _mark(state: dict[str, Any], index: int, mark: str) -> None:
    """Put ``mark`` on item ``index`` of ``state``."""
    marks = state["marks"]
    state["marks"] = f"{marks[:index]}{mark}{marks[index + 1 :]}"
