"""The hooks the engine calls on a step, whatever its kind.

Each kind of step (local code, a remote command, a wait for an event) is one class in
this package that overrides the hooks that apply to it; the engine calls them and never
asks which kind it holds. An answer a kind does not expect (a reply to a wait, a
deadline for local code) is refused here, once, for every kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar
from uuid import UUID

from pydantic import BaseModel

from saga.engine.state import Phase
from saga.errors import StaleReply, UnexpectedReply
from saga.messaging.control import DEAD_LETTERED, PURGED

if TYPE_CHECKING:
    from saga.engine.definition import Saga
    from saga.engine.steps.wait import WaitStep
    from saga.engine.transitions import Transition
    from saga.messaging.control import FailureReply, Signal, StepDeadline

#: One step as recorded for fingerprints and version checks.
StepShape = dict[str, Any]


class StepKind(ABC):
    """A step's hooks. Subclasses are frozen dataclasses with ``name``, ``pivot``, ``when``,
    ``retry`` and ``compensation`` fields."""

    __slots__ = ()

    #: The kind's name, as recorded in a definition's shape.
    kind: ClassVar[str]
    #: True for a kind whose attempts are messages (the step log keeps their ids).
    sends_messages: ClassVar[bool] = False

    @property
    def holds_dead_letters(self) -> bool:
        """True when a dead-lettered command keeps the saga at this step for an operator."""
        return False

    # -- moving forward --------------------------------------------------------

    @abstractmethod
    def begin(self, t: Transition) -> bool:
        """Start the step; True when it is done already (the saga goes on to the next)."""

    def resend(self, t: Transition, attempt: int, message_id: UUID | None = None) -> bool:
        """Try the step again (a retry timer, a deadline, a resume); False when there is
        nothing to send again (the saga is not stuck at it)."""
        return False

    # -- answers ---------------------------------------------------------------

    def take_success(self, t: Transition, reply: BaseModel) -> None:
        """The step succeeded: take its reply and go on to the next step."""
        self.take_reply(t, reply)
        t.log_step(self, Phase.FORWARD, "succeeded", t.record.step_started_at)
        t.record.completed_steps.append(self.name)
        t.go_on(t.saga.index(self.name) + 1)

    def take_failure(self, t: Transition, failure: FailureReply) -> None:
        """The step failed: retry it past the pivot, hold it, or compensate (this step
        included when its outcome is unknown)."""
        reason = f"{self.name}: {failure.reason}"
        t.log_step(self, Phase.FORWARD, "failed", t.record.step_started_at, reason)
        if t.saga.after_pivot(self.name):
            t.retry_or_give_up(self, Phase.FORWARD, reason)
        elif failure.code == DEAD_LETTERED and self.holds_dead_letters:
            t.hold(self, reason)
        elif failure.code in (DEAD_LETTERED, PURGED):
            t.compensate_in_doubt(self, reason)
        else:
            t.begin_compensation(reason, self)

    def take_reply(self, t: Transition, reply: BaseModel) -> None:
        """A success answering the step: update the saga's data from it."""
        raise UnexpectedReply(f"step {self.name!r} ({self.kind}) takes no reply")

    def take_deadline(self, t: Transition, deadline: StepDeadline) -> None:
        """No answer came in time."""
        raise StaleReply(f"step {self.name!r} ({self.kind}) has no deadline")

    def take_timeout(self, t: Transition) -> None:
        """The wait the step began timed out."""
        raise StaleReply(f"step {self.name!r} ({self.kind}) has no timeout")

    def take_event(self, t: Transition, signal: Signal) -> str | None:
        """The event the step waits for; return why it is refused (nothing changed)."""
        return f"step {self.name!r} ({self.kind}) waits for no event"

    # -- compensating ----------------------------------------------------------

    def compensate(self, t: Transition, attempt: int, message_id: UUID | None = None) -> bool:
        """Undo the step; True when that is done already (or there is nothing to undo),
        False when the saga now waits for the compensation's answer."""
        return True

    def take_undone(self, t: Transition) -> None:
        """A success answering the step's compensation: the step is undone."""
        t.step_undone(self)

    def take_undo_failure(self, t: Transition, failure: FailureReply) -> None:
        """A failure answering the step's compensation: retried, or given up on."""
        t.undo_failed(self, f"{self.name}: {failure.reason}", failure.code)

    def kept_for_compensation(self, state: dict[str, Any]) -> dict[str, Any]:
        """What of its part of the record (``step_state``) the step's compensation needs
        when the saga compensates while at it; the rest is over."""
        return {}

    def undo_late(self, t: Transition, reply: BaseModel) -> bool:
        """A success after the saga compensated past the step (or while the step is still
        among the steps to undo): take its reply, send nothing, and say whether the saga must
        put the step back among the steps to undo (it then compensates it, awaited and
        retried as any compensation). False when nothing more is to be done: there is no
        compensation, or the step's own compensation, still to come or under way, covers
        it. A step that takes the reply logs its late success."""
        return False

    # -- registration ----------------------------------------------------------

    def shape(self) -> StepShape:
        """What running sagas depend on in this step (kind, pivot, what it waits for)."""
        return {
            "step": self.name,
            "kind": self.kind,
            "pivot": self.pivot,
            "compensated": self.compensation is not None,
        }

    def problems(
        self, saga: Saga[Any], index: int, routes: dict[type[BaseModel], str]
    ) -> list[str]:
        """Mistakes in this step, found when the saga is registered."""
        return []

    def parts(self) -> tuple[StepKind, ...]:
        """The step and the steps inside it (each with a name of its own)."""
        return (self,)

    def signal_payload(self) -> type[BaseModel] | None:
        """The model a signal for this step is checked against (None: it takes none)."""
        return None

    def key_of_event(self, event: BaseModel) -> str | None:
        """The key a published ``event`` carries for this step (None: it waits for none)."""
        return None

    def event_waits(self) -> tuple[WaitStep, ...]:
        """The waits for published events in this step (its service subscribes to them)."""
        return ()

    def expects(self) -> tuple[type[BaseModel], ...]:
        """The reply types answering this step, which the saga's home service decodes
        (a published event a wait ends on is subscribed to, not a reply)."""
        return ()

    def joined_replies(self) -> tuple[StepKind, ...]:
        """The steps in this one whose replies may come several at a time, all awaited
        before the saga goes on (a parallel group's remote members and fan-outs, a
        fan-out's items): their reply types are the ones the consumer of the saga's home
        looks at for the ``joins`` header (:mod:`saga.engine.reply_joins`)."""
        return ()

    # fields every kind declares (dataclass fields in the subclasses)
    if TYPE_CHECKING:
        name: str
        pivot: bool
        compensation: Any
        retry: Any
        when: Any
