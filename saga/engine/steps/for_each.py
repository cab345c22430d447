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
"""

from __future__ import annotations

import hashlib
import json
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

    def _checked_items(self, t: Transition) -> list[Any]:
        """The items, which must be the ones the fan-out began with."""
        items = self._items(t.data)
        if self._digest(items) != t.record.step_state["digest"]:
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
        try:
            items = self._items(t.data)
        except ConfigurationError as exc:
            t.log_step(self, Phase.FORWARD, "failed", t.at, str(exc), attempt=1)
            t.begin_compensation(str(exc), self)
            return False
        if not items:
            t.log_step(self, Phase.FORWARD, "succeeded", t.at, attempt=1)
            return True
        t.record.step_state = {
            "marks": TO_SEND * len(items),
            "awaits": {},
            "digest": self._digest(items),
        }
        t.record.step_started_at = t.at
        self._send_more(t, items)
        return False

    def resend(self, t: Transition, attempt: int, message_id: UUID | None = None) -> bool:
        """Send every item still out again, under its own message id (a resume)."""
        state = t.record.step_state
        if not state.get("awaits"):
            return False
        items = self._checked_items(t)
        for message, index in state["awaits"].items():
            self._send(t, items, index, UUID(message))
        self._settle(t)
        return True

    def _send_more(self, t: Transition, items: list[Any]) -> None:
        """Send items until ``max_in_flight`` are out (or none is left), then wait."""
        state = t.record.step_state
        marks = state["marks"]
        while len(state["awaits"]) < self.max_in_flight and (index := marks.find(TO_SEND)) >= 0:
            envelope = self._send(t, items, index, None)
            state["awaits"][str(envelope.message_id)] = index
            marks = f"{marks[:index]}{OUT}{marks[index + 1 :]}"
        state["marks"] = marks
        self._settle(t)

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

    def _answered(self, t: Transition) -> Any:
        """What ``awaits`` kept of the message the event answers, now no longer out: the
        item's position (forward), or its position and attempt (compensation)."""
        message = str(t.cause.causation_id) if t.cause else None
        entry = t.record.step_state["awaits"].pop(message, None)
        if entry is None:
            raise StaleReply(f"fan-out {self.name!r} awaits no message {message}")
        t.record.pending_message_id = UUID(message)
        return entry

    def _mark(self, t: Transition, index: int, mark: str) -> None:
        marks = t.record.step_state["marks"]
        t.record.step_state["marks"] = f"{marks[:index]}{mark}{marks[index + 1 :]}"

    def take_success(self, t: Transition, reply: BaseModel) -> None:
        index = int(self._answered(t))
        if self.reply is not None and not isinstance(reply, self.reply):
            raise UnexpectedReply(
                f"fan-out {self.name!r} expects {self.reply.__name__}, got {type(reply).__name__}"
            )
        self._mark(t, index, SUCCEEDED)
        items = None
        if self.on_reply is not None:
            item = self._checked_items(t)[index]
            t.set_data(self.on_reply(t.data, item, reply), f"on_reply of {self.name!r}")
            items = self._checked_items(t)  # the reducer left the items as they were
        self._next(t, items)

    def take_failure(self, t: Transition, failure: FailureReply) -> None:
        index = int(self._answered(t))
        in_doubt = failure.code in (DEAD_LETTERED, PURGED)
        self._mark(t, index, IN_DOUBT if in_doubt else FAILED)
        reason = f"{self.name}[{index}]: {failure.reason}"
        t.log_step(self, Phase.FORWARD, "failed", t.record.step_started_at, reason)
        t.record.step_state.setdefault("failed", reason)
        self._next(t)

    def _next(self, t: Transition, items: list[Any] | None = None) -> None:
        """After an answer: send more, go on when every item succeeded, or compensate once
        nothing is out after a failure or a cancel. ``items``: already checked for this
        answer (each check reads and digests every item)."""
        state = t.record.step_state
        stopping = "failed" in state or t.record.cancel_requested
        if not stopping and TO_SEND in state["marks"]:
            self._send_more(t, items if items is not None else self._checked_items(t))
        elif state["awaits"]:
            self._settle(t)
        elif not stopping:
            t.log_step(self, Phase.FORWARD, "succeeded", t.record.step_started_at)
            t.record.step_state = {}
            t.record.completed_steps.append(self.name)
            t.record.step = self.name
            t.go_on(t.saga.index(self.name) + 1)
        else:
            if SUCCEEDED in state["marks"] or IN_DOUBT in state["marks"]:
                t.record.completed_steps.append(self.name)
            t.begin_compensation(state.get("failed") or t.record.last_error or "cancelled", self)

    # -- compensating ----------------------------------------------------------

    def kept_for_compensation(self, state: dict[str, Any]) -> dict[str, Any]:
        marks = state.get("marks", "")
        if SUCCEEDED in marks or IN_DOUBT in marks:
            return {"marks": marks, "digest": state["digest"]}
        return {}

    def compensate(self, t: Transition, attempt: int, message_id: UUID | None = None) -> bool:
        """Begin undoing the items (or go on after a resume, or an item's retry timer)."""
        record = t.record
        if self.compensation is None:  # nothing to undo
            record.step_state = {}
            return True
        if "marks" not in record.step_state:  # the fan-out completed: every item took effect
            items = self._items(t.data)
            record.step_state = {"marks": SUCCEEDED * len(items), "digest": self._digest(items)}
        awaits = record.step_state.setdefault("awaits", {})
        items = self._checked_items(t)
        timer = awaits.pop(str(t.cause.message_id), None) if t.cause else None
        if timer is not None:  # an item's retry timer: its compensation, again
            self._undo(t, items, timer[0], attempt, None)
        elif awaits:  # a resume: every item compensation still out, again, under its id
            for message, (index, sent_attempt) in list(awaits.items()):
                self._undo(t, items, index, sent_attempt, UUID(message))
        else:  # the first items, or a resume after giving up: those left out, again
            record.step_started_at = t.at
            marks = record.step_state["marks"]
            for index in [i for i, mark in enumerate(marks) if mark == UNDOING]:
                self._undo(t, items, index, 1, None)
            self._undo_more(t, items)
        if awaits:
            self._settle(t)
            return False
        record.step_state = {}
        return True

    def take_undone(self, t: Transition) -> None:
        """An item is undone: send the next, or, the last one undone, go on to the steps
        before the fan-out."""
        self._mark(t, self._undo_answered(t), UNDONE)
        state = t.record.step_state
        if self._next_to_undo(state["marks"]) >= 0:
            self._undo_more(t, self._checked_items(t))
        if state["awaits"]:
            t.log_step(self, Phase.COMPENSATION, "succeeded", t.record.step_started_at)
            self._settle(t)
        else:
            t.record.step_state = {}
            t.step_undone(self)

    def take_undo_failure(self, t: Transition, failure: FailureReply) -> None:
        """An item's compensation failed: its retry timer is awaited with the rest; once the
        saga gives up, the compensations still out are no longer awaited (a resume sends
        them again, under their keys)."""
        index = self._undo_answered(t)
        attempt = t.record.step_attempt
        t.undo_failed(self, f"{self.name}[{index}]: {failure.reason}", failure.code)
        awaits = t.record.step_state["awaits"]
        if t.record.status is SagaStatus.COMPENSATION_FAILED:
            awaits.clear()
        else:
            awaits[str(t.record.pending_message_id)] = [index, attempt + 1]
            self._settle(t)

    def _undo_answered(self, t: Transition) -> int:
        """The position of the item whose compensation the event answers; the saga's
        attempt is that compensation's (for the step log and its retry)."""
        index, attempt = self._answered(t)
        t.record.step_attempt = attempt
        return int(index)

    @staticmethod
    def _next_to_undo(marks: str) -> int:
        """The latest item that took effect (or may have) and is not undone yet; -1: none."""
        return max(marks.rfind(SUCCEEDED), marks.rfind(IN_DOUBT))

    def _undo_more(self, t: Transition, items: list[Any]) -> None:
        """Send item compensations, latest item first, until ``max_in_flight`` are out."""
        state = t.record.step_state
        marks = state["marks"]
        while (
            len(state["awaits"]) < self.max_in_flight and (index := self._next_to_undo(marks)) >= 0
        ):
            self._undo(t, items, index, 1, None)
            marks = f"{marks[:index]}{UNDOING}{marks[index + 1 :]}"
        state["marks"] = marks

    def _undo(
        self, t: Transition, items: list[Any], index: int, attempt: int, message_id: UUID | None
    ) -> None:
        """Send item ``index``'s compensation (under ``message_id``: again), now awaited."""
        assert self.compensation is not None
        item = items[index]
        message = self._build(t, self.compensation, item, "compensation")
        envelope = t.envelopes.undo(message, self, self._key(t, index, item), message_id)
        t.outgoing.append(OutgoingMessage(envelope, self.compensation_service or self.service))
        t.record.step_state["awaits"][str(envelope.message_id)] = [index, attempt]

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
