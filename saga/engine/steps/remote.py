"""A remote step: a command sent to a participant service, completed by its reply."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pydantic import BaseModel

from saga.db.sql import validate_name
from saga.engine.builders import CommandBuilder, FieldsBuilder
from saga.engine.state import Phase, SagaStatus
from saga.engine.steps.kind import StepKind, StepShape
from saga.engine.steps.options import COMPENSATE, HOLD, RETRY, Condition, ReplyHandler, StepRetry
from saga.errors import ConfigurationError, UnexpectedReply
from saga.messaging.control import StepDeadline
from saga.messaging.envelope import message_type_of
from saga.messaging.outbox import OutgoingMessage

if TYPE_CHECKING:
    from saga.engine.definition import Saga
    from saga.engine.transitions import Transition

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RemoteStep(StepKind):
    """A command sent to a participant service, completed by its reply."""

    name: str
    command: CommandBuilder
    service: str | None = None
    command_type: type[BaseModel] | None = None
    reply: type[BaseModel] | None = None
    on_reply: ReplyHandler | None = None
    compensation: CommandBuilder | None = None
    compensation_service: str | None = None
    when: Condition | None = None
    pivot: bool = False
    retry: StepRetry | None = None
    deadline: timedelta | None = None
    on_deadline: str = RETRY
    on_dead_letter: str = COMPENSATE

    kind = "remote"
    sends_messages = True

    def __post_init__(self) -> None:
        for option, value, allowed in (
            ("on_deadline", self.on_deadline, (RETRY, COMPENSATE)),
            ("on_dead_letter", self.on_dead_letter, (COMPENSATE, HOLD)),
        ):
            if value not in allowed:
                raise ConfigurationError(
                    f"step {self.name!r}: {option} must be {allowed[0]!r} or {allowed[1]!r}, "
                    f"not {value!r}"
                )

    @property
    def holds_dead_letters(self) -> bool:
        return self.on_dead_letter == HOLD

    # -- moving forward --------------------------------------------------------

    def begin(self, t: Transition) -> bool:
        self.resend(t, attempt=1)
        return False

    def resend(self, t: Transition, attempt: int, message_id: UUID | None = None) -> bool:
        """Send the command (again, under ``message_id``), and its deadline timer."""
        envelope = t.envelopes.command(self, t.data, message_id)
        t.sent(envelope, t.saga.service_of(self), self.name, attempt)
        t.record.status = SagaStatus.RUNNING
        if self.deadline is not None:
            timer = StepDeadline(
                saga_id=t.record.id, step=self.name, awaited=envelope.message_id, attempt=attempt
            )
            control = t.envelopes.control(timer, self)
            t.outgoing.append(OutgoingMessage(control, t.home_service, self.deadline))
        return True

    # -- answers ---------------------------------------------------------------

    def take_reply(self, t: Transition, reply: BaseModel) -> None:
        if self.reply and not isinstance(reply, self.reply):
            raise UnexpectedReply(
                f"step {self.name!r} expects {self.reply.__name__}, got {type(reply).__name__}"
            )
        if self.on_reply is not None:
            t.set_data(self.on_reply(t.data, reply), f"on_reply of {self.name!r}")

    def take_deadline(self, t: Transition, deadline: StepDeadline) -> None:
        reason = f"{self.name}: no reply within {self.deadline}"
        t.log_step(self, Phase.FORWARD, "deadline_exceeded", t.record.step_started_at, reason)
        retry = t.saga.retry_for(self)
        if self.on_deadline == RETRY and deadline.attempt < retry.attempts:
            self.resend(t, deadline.attempt + 1, message_id=deadline.awaited)
        elif t.saga.after_pivot(self.name):
            t.give_up(self, Phase.FORWARD, reason)
        else:
            t.compensate_in_doubt(self, reason)

    # -- compensating ----------------------------------------------------------

    def compensate(self, t: Transition, attempt: int, message_id: UUID | None = None) -> bool:
        if self.compensation is None:
            return True
        envelope = t.envelopes.compensation(self, t.data, message_id)
        t.sent(envelope, t.saga.compensation_service(self), self.name, attempt)
        return False

    def undo_late(self, t: Transition, reply: BaseModel) -> bool:
        if self.compensation is None or self.name in t.record.completed_steps:
            return False  # nothing to undo, or it is still to be compensated in order
        if self.on_reply is not None:  # its compensation may need what the reply says
            t.set_data(self.on_reply(t.data, reply), f"on_reply of {self.name!r}")
        note = "succeeded after the saga compensated past it; to be compensated"
        t.log_step(self, Phase.FORWARD, "late_success", t.at, note)
        logger.warning(
            "saga %s: late success of step %s, to be undone",
            t.record.id,
            self.name,
            extra={"saga_id": str(t.record.id), "step": self.name},
        )
        return True

    # -- registration ----------------------------------------------------------

    def shape(self) -> StepShape:
        reply = message_type_of(self.reply) if self.reply is not None else None
        return {**StepKind.shape(self), "reply": reply}

    def expects(self) -> tuple[type[BaseModel], ...]:
        return (self.reply,) if self.reply is not None else ()

    def problems(
        self, saga: Saga[Any], index: int, routes: dict[type[BaseModel], str]
    ) -> list[str]:
        return [*self._route_problems(routes), *self._field_problems(saga.data_model)]

    def _field_problems(self, data_model: type[BaseModel]) -> list[str]:
        """Messages built from the data's fields that need a field the data lacks."""
        problems: list[str] = []
        for what, builder in (("command", self.command), ("compensation", self.compensation)):
            if isinstance(builder, FieldsBuilder):
                missing = builder.missing_fields(data_model)
                if missing:
                    problems.append(
                        f"step {self.name!r}: its {what} {builder.model.__name__} is built from "
                        f"the fields of {data_model.__name__}, which lacks its required "
                        f"field(s) {', '.join(missing)}; add them to the data, or pass a "
                        "function of the data"
                    )
        return problems

    def _route_problems(self, routes: dict[type[BaseModel], str]) -> list[str]:
        if self.service:
            try:
                validate_name(self.service, "service name")
            except ConfigurationError as exc:
                return [f"step {self.name!r}: {exc}"]
            return []
        if self.command_type is None:
            return [
                f"step {self.name!r}: the command's type is unknown and no service= is given; "
                "pass service=, or a message class / annotated function as command="
            ]
        if self.command_type not in routes:
            return [
                f"step {self.name!r}: command type {self.command_type.__name__} has no route; "
                "pass service= or add it to the registry's routes"
            ]
        return []
