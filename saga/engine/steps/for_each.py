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
are compensated one at a time, latest first, then the steps before the fan-out. While an
item's compensation is out, the fan-out's name stands twice at the end of the completed
steps: once for the fan-out, once for the item being undone; the compensation's success
takes the second off, and the fan-out goes on to its next item.

A fan-out may also be a member of a parallel group (:mod:`saga.engine.steps.parallel`):
the group keeps the fan-out's state, the same three keys, under the member's name in its
own, and calls ``start_items``, ``take_item_success``, ``take_item_failure`` and
``resend_items`` with it. There the fan-out joins the completed steps with its first item
that took effect, an item that fails fails the group at once, and the items
still out then are kept (their message ids) so that a success arriving later is undone:
with the fan-out's other items if its compensation is still to come, at once otherwise.
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
TO_SEND, OUT, SUCCEEDED, FAILED, IN_DOUBT, UNDONE = ".>+x?-"


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
        self._settle(t)
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
        self._settle(t)
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

    def _settle(self, t: Transition) -> None:
        """The saga waits at the fan-out; its pending message is the first one still out."""
        record = t.record
        record.step = self.name
        awaits = record.step_state["awaits"]
        record.pending_message_id = UUID(next(iter(awaits))) if awaits else None
        record.step_attempt = 1

    def _answered(self, t: Transition, state: dict[str, Any]) -> int:
        """The position of the item whose command the event answers, now no longer out."""
        message = str(t.cause.causation_id) if t.cause else None
        index = state["awaits"].pop(message, None)
        if index is None:
            raise StaleReply(f"fan-out {self.name!r} awaits no message {message}")
        t.record.pending_message_id = UUID(message)
        return int(index)

    def take_success(self, t: Transition, reply: BaseModel) -> None:
        state = t.record.step_state
        self._next(t, self._succeeded(t, state, self._answered(t, state), reply))

    def take_item_success(self, t: Transition, state: dict[str, Any], reply: BaseModel) -> bool:
        """An item succeeded, the fan-out being a group's member (``state``: its part): send
        the next items; True when every item has succeeded."""
        items = self._succeeded(t, state, self._answered(t, state), reply)
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
        index = self._answered(t, state)
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
            self._settle(t)
        elif state["awaits"]:
            self._settle(t)
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
        group that failed), whose late successes are undone; nothing without a compensation."""
        if self.compensation is None:
            return {}
        marks = state.get("marks", "")
        kept = {"marks": marks, "digest": state.get("digest")}
        if state.get("awaits"):
            return {**kept, "awaits": state["awaits"]}
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
        """Its compensation is over: forget its state, but for the items still out (their
        late successes are undone when they come)."""
        for key in ("marks", "undoing"):
            state.pop(key, None)
        if state.get("awaits"):
            return
        state.pop("digest", None)
        members = t.record.step_state.get("members", {})
        if members.get(self.name) is state:
            del members[self.name]
            if not members:
                del t.record.step_state["members"]

    def compensate(self, t: Transition, attempt: int, message_id: UUID | None = None) -> bool:
        record = t.record
        state = self._undo_state(t)
        if self.compensation is None:  # nothing to undo
            self._undone(t, state)
            return True
        if "marks" not in state:  # the fan-out completed: every item took effect
            items = self._items(t.data)
            state.update(marks=SUCCEEDED * len(items), digest=self._digest(items))
        undoing = state.get("undoing")
        if undoing is not None and record.completed_steps[-2:] == [self.name, self.name]:
            self._undo(t, state, undoing, attempt, message_id)  # that item's compensation, again
            return False
        if undoing is not None:
            _mark(state, undoing, UNDONE)
        marks = state["marks"]
        index = max(marks.rfind(SUCCEEDED), marks.rfind(IN_DOUBT))
        if index < 0:
            self._undone(t, state)
            return True
        state["undoing"] = index
        record.completed_steps.append(self.name)
        self._undo(t, state, index, attempt, None)
        return False

    def _undo(
        self,
        t: Transition,
        state: dict[str, Any],
        index: int,
        attempt: int,
        message_id: UUID | None,
    ) -> None:
        envelope = self._undoing(t, state, index, message_id)
        t.sent(envelope, self.compensation_service or self.service, self.name, attempt)

    def _undoing(
        self, t: Transition, state: dict[str, Any], index: int, message_id: UUID | None = None
    ) -> Envelope:
        """The compensation of item ``index``, under that item's key."""
        assert self.compensation is not None
        item = self._checked_items(t, state)[index]
        message = self._build(t, self.compensation, item, "compensation")
        return t.envelopes.undo(message, self, self._key(t, index, item), message_id)

    def undo_late(self, t: Transition, reply: BaseModel) -> bool:
        """An item still out when its group failed succeeded: undone with the fan-out's other
        items if the fan-out's compensation is still to come (or under way), else now."""
        state = t.record.step_state.get("members", {}).get(self.name, {})
        message = str(t.cause.causation_id) if t.cause else None
        if self.compensation is None or message not in state.get("awaits", {}):
            return False
        index = int(state["awaits"].pop(message))
        if self.on_reply is not None:
            item = self._checked_items(t, state)[index]
            t.set_data(self.on_reply(t.data, item, reply), f"on_reply of {self.name!r}")
        if self.name in t.record.completed_steps:
            _mark(state, index, SUCCEEDED)
            note = f"item {index} succeeded after its group failed; undone with the others"
        else:
            envelope = self._undoing(t, state, index)
            t.outgoing.append(OutgoingMessage(envelope, self.compensation_service or self.service))
            self._undone(t, state)
            note = f"item {index} succeeded after its group failed; {envelope.type} sent"
        t.log_step(self, Phase.FORWARD, "late_success", t.at, note)
        logger.warning(
            "saga %s: late success of fan-out %s item %d undone",
            t.record.id,
            self.name,
            index,
            extra={"saga_id": str(t.record.id), "step": self.name},
        )
        return True

    # -- registration ----------------------------------------------------------

    def shape(self) -> StepShape:
        reply = message_type_of(self.reply) if self.reply is not None else None
        return {**StepKind.shape(self), "reply": reply, "keyed": self.key is not None}

    def expects(self) -> tuple[type[BaseModel], ...]:
        return (self.reply,) if self.reply is not None else ()

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
