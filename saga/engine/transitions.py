"""A saga's transitions: what one event does to one saga, decided without I/O.

A :class:`Transition` is built from the saga's record and the time of the event,
then changed by that event (a reply, a failure, a timer, a signal, a resume, a
deadline). :meth:`Transition.result` says what must happen: the new record, the
step-log entries, the messages to send and any dead letter. Nothing here reads
the clock or touches the database; local steps, the one place user code writes,
are run by the caller's :class:`LocalSteps`, and their timing comes back with
their outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from saga.engine.definition import Saga, Step
from saga.engine.state import Phase, SagaRecord, SagaStatus, StepLogEntry
from saga.engine.step_envelopes import StepEnvelopes
from saga.engine.steps.kind import StepKind
from saga.engine.transition_results import LocalSteps, TransitionResult, stopped_saga_letter
from saga.errors import ConfigurationError, StaleReply
from saga.messaging.control import (
    DEAD_LETTERED,
    FailureReply,
    Signal,
    StepDeadline,
    StepTimer,
)
from saga.messaging.dead_letters import DeadLetter
from saga.messaging.envelope import Envelope
from saga.messaging.ids import uuid7
from saga.messaging.outbox import OutgoingMessage

logger = logging.getLogger(__name__)


class Transition:
    """One saga instance changed by one event."""

    def __init__(
        self,
        saga: Saga[Any],
        record: SagaRecord,
        *,
        cause: Envelope | None,
        at: datetime,
        home_service: str,
        local_steps: LocalSteps,
        new_id: Callable[[], UUID] = uuid7,
    ) -> None:
        self.at = at
        self.cause = cause
        self.home_service = home_service
        self.local_steps = local_steps
        self.new_id = new_id
        self.envelopes = StepEnvelopes(saga, record.id, cause, home_service, new_id)
        self.initial_status = record.status
        self.saga = saga
        self.record = record
        self.data: BaseModel = saga.data_model.model_validate(record.data)
        self.log: list[StepLogEntry] = []
        self.outgoing: list[OutgoingMessage] = []
        self.dead_letters: list[DeadLetter] = []
        self.started_wait: tuple[str, str] | None = None  # a wait for (event type, key) begun

    # -- events --------------------------------------------------------------

    def on_success(self, reply: BaseModel) -> None:
        step = self._current()
        self._release_hold()
        if self.record.status is SagaStatus.RUNNING:
            step.take_success(self, reply)
        else:
            step.take_undone(self)

    def on_failure(self, failure: FailureReply) -> None:
        step = self._current()
        self._release_hold()
        if self.record.status is SagaStatus.RUNNING:
            step.take_failure(self, failure)
        else:
            step.take_undo_failure(self, failure)

    def on_timer(self, timer: StepTimer) -> None:
        step = self.saga.step(timer.step)
        if timer.phase == Phase.FORWARD:
            step.resend(self, timer.attempt)
        else:
            self._compensate_next(attempt=timer.attempt)

    def begin(self) -> bool:
        """Run the first steps of a saga recorded without them (``start_async``).

        False when the saga has already begun (its start message came twice, or
        a resume got there first).
        """
        record = self.record
        if record.status is not SagaStatus.RUNNING or record.step or record.completed_steps:
            return False
        self.advance(0)
        return True

    def resume(self) -> bool:
        """Try again what stopped the saga; False when there is nothing to resume."""
        record = self.record
        if self.begin():  # its start message was lost
            return True
        self._release_hold()  # a held step is sent again, like a stuck one
        if record.status is SagaStatus.COMPENSATION_FAILED:
            record.status = SagaStatus.COMPENSATING
            self._compensate_next(attempt=1)
            return True
        if record.status is SagaStatus.FORWARD_FAILED:
            return self._current().resend(self, attempt=1)
        if record.status.finished or record.pending_message_id is None or record.step is None:
            return False
        # Stuck waiting: send the pending request again under the same message id, so a
        # participant that did handle it answers it again with its kept reply (inbox) and
        # one that did not handles it now.
        # (A saga waiting for an event is not stuck: its step sends nothing again.)
        if record.status is SagaStatus.RUNNING:
            return self._current().resend(self, record.step_attempt, record.pending_message_id)
        self._compensate_next(record.step_attempt, message_id=record.pending_message_id)
        return True

    # -- waiting for events, timeouts and deadlines ----------------------------

    def on_signal(self, signal: Signal) -> str | None:
        """Apply ``signal``; return why it was refused (then nothing is changed)."""
        record = self.record
        if record.status is not SagaStatus.RUNNING or record.step is None:
            return f"saga is {record.status.value} and not waiting"
        return self._current().take_event(self, signal)

    def on_wait_timeout(self) -> None:
        self._current().take_timeout(self)

    def on_deadline(self, deadline: StepDeadline) -> None:
        self._current().take_deadline(self, deadline)

    # -- steps whose outcome is unknown -----------------------------------------

    def compensate_in_doubt(self, step: StepKind, reason: str) -> None:
        """Compensate, this step included: its command may have had its effect (the
        participant gave up after technical failures, or never answered in time)."""
        self.record.completed_steps.append(step.name)
        self.begin_compensation(reason, step)

    def hold(self, step: StepKind, reason: str) -> None:
        """Keep the saga at ``step`` until the operator replays or purges its dead letter.

        The pending message id stays: the replayed command keeps it, so its reply is the
        one this saga waits for; a purge answers with a ``purged`` failure under it.
        """
        record = self.record
        record.status = SagaStatus.STEP_DEAD_LETTERED
        record.last_error = reason
        note = "held: replay the dead letter to go on, or purge it to compensate"
        self.log_step(step, Phase.FORWARD, "held", self.at, note)
        logger.warning(
            "saga %s held at step %s: its command is a dead letter (%s)",
            record.id,
            step.name,
            reason,
            extra={"saga_id": str(record.id), "step": step.name},
        )

    def _release_hold(self) -> None:
        """An answer for a held step (a replay's reply, a purge) puts the saga back to work."""
        if self.record.status is SagaStatus.STEP_DEAD_LETTERED:
            self.record.status = SagaStatus.RUNNING

    def undo_late_success(self, step_name: str, reply: BaseModel) -> bool:
        """A success for a step the saga already compensated past: undo it.

        Happens when a command ran after the saga gave up on it (a parallel group's member
        still out when a sibling failed, a slow redelivery, a replay on a participant that
        keeps no closed-step record). The step is undone as any compensated step is, its
        compensation awaited, retried under its retry policy and given up on for an
        operator: a compensation sent and forgotten could fail unseen and leave the effect
        in place. Whether the step is still to be compensated in order is the step's to
        say: a fan-out there takes a late item's success into the items it will undo.
        Returns True when the saga changed and must be written: the step is to be undone
        again, or took the reply in (its late success logged); False when there is nothing
        to undo (it has no compensation, or the saga did not compensate).
        """
        record = self.record
        compensated_states = (
            SagaStatus.COMPENSATING,
            SagaStatus.COMPENSATED,
            SagaStatus.COMPENSATION_FAILED,
        )
        if record.status not in compensated_states:
            return False
        step = self.saga.find(step_name)
        if step is None:
            return False
        if step.undo_late(self, reply):
            self._undo_late(step)
        return bool(self.log)

    def _undo_late(self, step: StepKind) -> None:
        """Put ``step`` back among the steps to undo. A saga still undoing steps (or stopped
        at one's failed compensation) undoes it right after that one, whose compensation may
        be out; a compensated saga compensates again, for this step alone, and is
        compensated once it is undone."""
        completed = self.record.completed_steps
        if completed:
            completed.insert(len(completed) - 1, step.name)
            return
        self.record.status = SagaStatus.COMPENSATING
        completed.append(step.name)
        self._compensate_next(attempt=1)

    # -- moving forward ------------------------------------------------------

    def advance(self, index: int) -> None:
        """Run steps from ``index`` on: local ones now, up to the next remote one."""
        for step in self.saga.steps[index:]:
            if step.when is not None and not step.when(self.data):
                self.log_step(step, Phase.FORWARD, "skipped", self.at, attempt=1)
                continue
            if not step.begin(self):
                return
        self.record.status = SagaStatus.COMPLETED
        self.record.step = None
        self.record.pending_message_id = None

    def go_on(self, index: int) -> None:
        """Go on from step ``index`` now the current step is answered (by a reply, a signal
        or a timeout), or compensate instead if a cancel was requested meanwhile."""
        if self.record.cancel_requested:
            answered = self.saga.step(self.record.step) if self.record.step else None
            self.begin_compensation(self.record.last_error or "cancelled", answered)
        else:
            self.advance(index)

    # -- compensating ---------------------------------------------------------

    def begin_compensation(self, reason: str, cause: StepKind | None) -> None:
        """Compensate because of ``cause`` (the step that failed, or was answered when a
        cancel was waiting), kept as the saga's ``failed_step``."""
        self.record.status = SagaStatus.COMPENSATING
        self.record.last_error = reason
        self.record.failed_step = cause.name if cause is not None else None
        current = self.saga.find(self.record.step) if self.record.step else None
        # what the current step kept while it ran is over, but for what undoing it needs
        state = current.kept_for_compensation(self.record.step_state) if current else {}
        self.record.step_state = state
        self._compensate_next(attempt=1)

    def step_undone(self, step: StepKind) -> None:
        """``step``'s compensation succeeded: go on undoing the steps before it."""
        self.log_step(step, Phase.COMPENSATION, "succeeded", self.record.step_started_at)
        self.record.completed_steps.pop()
        self._compensate_next(attempt=1)

    def undo_failed(self, step: StepKind, reason: str, code: str | None) -> None:
        """A compensation of ``step`` failed: retry it, or give up (a dead letter, or its
        retries spent) and leave the saga to an operator's resume."""
        self.log_step(step, Phase.COMPENSATION, "failed", self.record.step_started_at, reason)
        if code == DEAD_LETTERED:
            self.give_up(step, Phase.COMPENSATION, reason)
        else:
            self.retry_or_give_up(step, Phase.COMPENSATION, reason)

    def _compensate_next(self, attempt: int, message_id: UUID | None = None) -> None:
        """Compensate the completed steps, latest first, until one waits for an answer."""
        completed = self.record.completed_steps
        while completed:
            if not self.saga.step(completed[-1]).compensate(self, attempt, message_id):
                return
            completed.pop()
            attempt, message_id = 1, None
        self.record.status = SagaStatus.COMPENSATED
        self.record.step = None
        self.record.pending_message_id = None

    # -- retries and giving up -----------------------------------------------

    def retry_or_give_up(self, step: StepKind, phase: Phase, reason: str) -> None:
        attempt = self.record.step_attempt
        retry = self.saga.retry_for(step)
        if attempt >= retry.attempts:
            self.give_up(step, phase, reason)
            return
        delay = timedelta(seconds=retry.delay(attempt))
        timer = StepTimer(
            saga_id=self.record.id, step=step.name, phase=phase.value, attempt=attempt + 1
        )
        envelope = self.envelopes.control(timer, step)
        self.outgoing.append(OutgoingMessage(envelope, self.home_service, delay))
        self.record.step = step.name
        self.record.pending_message_id = envelope.message_id
        logger.warning(
            "saga %s step %s (%s) failed on attempt %d, retrying in %s: %s",
            self.record.id,
            step.name,
            phase.value,
            attempt,
            delay,
            reason,
            extra={"saga_id": str(self.record.id), "step": step.name},
        )

    def give_up(self, step: StepKind, phase: Phase, reason: str) -> None:
        record = self.record
        record.status = (
            SagaStatus.COMPENSATION_FAILED
            if phase is Phase.COMPENSATION
            else SagaStatus.FORWARD_FAILED
        )
        record.last_error = reason
        record.pending_message_id = None
        record.step = step.name
        error_type = "CompensationFailed" if phase is Phase.COMPENSATION else "ForwardStepFailed"
        self.dead_letters.append(stopped_saga_letter(record, self.home_service, error_type, reason))
        logger.error(
            "saga %s is %s at step %s: %s",
            record.id,
            record.status.value,
            step.name,
            reason,
            extra={"saga_id": str(record.id), "step": step.name},
        )

    # -- plumbing ------------------------------------------------------------

    def sent(self, envelope: Envelope, service: str, step: str, attempt: int) -> None:
        """Queue ``envelope`` for ``service``; the saga now waits for its reply."""
        self.outgoing.append(OutgoingMessage(envelope, service))
        record = self.record
        if record.step != step or attempt == 1 or record.step_started_at is None:
            record.step_started_at = self.at
        record.step = step
        record.pending_message_id = envelope.message_id
        record.step_attempt = attempt

    def _pivot_reached(self) -> bool:
        pivot = self.saga.pivot_index
        if pivot is None:
            return False
        names = [*self.record.completed_steps, *([self.record.step] if self.record.step else [])]
        return any(self.saga.index(name) >= pivot for name in names)

    def _current(self) -> Step:
        if self.record.step is None:
            raise StaleReply(f"saga {self.record.id} has no current step")
        return self.saga.step(self.record.step)

    def set_data(self, value: object, where: str) -> None:
        if not isinstance(value, self.saga.data_model):
            raise ConfigurationError(
                f"{where} returned {type(value).__name__}; it must return "
                f"{self.saga.data_model.__name__} (or None to keep the data)"
            )
        self.data = value

    def log_step(
        self,
        step: StepKind,
        phase: Phase,
        outcome: str,
        started: datetime | None,
        error: str | None = None,
        finished: datetime | None = None,
        attempt: int | None = None,
    ) -> None:
        finished = finished or self.at
        self.log.append(
            StepLogEntry(
                saga_id=self.record.id,
                step=step.name,
                phase=phase,
                attempt=attempt or self.record.step_attempt,
                outcome=outcome,
                started_at=started or finished,
                finished_at=finished,
                error=error,
                message_id=self.record.pending_message_id if step.sends_messages else None,
            )
        )

    def result(self) -> TransitionResult:
        """What this transition decided (its data checked: storable, within the cap)."""
        self.saga.check_data(self.data)
        self.record.data = self.data.model_dump(mode="json")
        self.record.pivot_reached = self._pivot_reached()
        status = self.record.status
        changed = status != self.initial_status
        ended = status if changed and (status.finished or status.needs_operator) else None
        return TransitionResult(
            self.record, self.log, self.outgoing, self.dead_letters, ended, self.started_wait
        )
