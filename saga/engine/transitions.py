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
from functools import cache
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from saga.engine.definition import (
    COMPENSATE,
    HOLD,
    RETRY,
    LocalStep,
    RemoteStep,
    Saga,
    Step,
    WaitStep,
)
from saga.engine.outcomes import LocalSteps, TransitionResult, stopped_saga_letter
from saga.engine.state import Phase, SagaRecord, SagaStatus, StepLogEntry
from saga.engine.step_envelopes import StepEnvelopes
from saga.errors import (
    ConfigurationError,
    StaleReply,
    StepFailed,
    UnexpectedReply,
)
from saga.messaging.control import (
    DEAD_LETTERED,
    PURGED,
    FailureReply,
    Signal,
    StepDeadline,
    StepTimer,
    WaitTimeout,
)
from saga.messaging.dead_letters import DeadLetter
from saga.messaging.envelope import Envelope
from saga.messaging.ids import uuid7
from saga.messaging.outbox import OutgoingMessage

logger = logging.getLogger(__name__)


@cache
def _schema(payload: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema a waiting saga checks signals against (the same for every wait)."""
    return payload.model_json_schema()


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
            if isinstance(step, RemoteStep) and step.reply and not isinstance(reply, step.reply):
                raise UnexpectedReply(
                    f"step {step.name!r} expects {step.reply.__name__}, got {type(reply).__name__}"
                )
            if isinstance(step, RemoteStep) and step.on_reply is not None:
                self._set_data(step.on_reply(self.data, reply), f"on_reply of {step.name!r}")
            self._log(step, Phase.FORWARD, "succeeded", self.record.step_started_at)
            self.record.completed_steps.append(step.name)
            self._go_on(self.saga.index(step.name) + 1)
        else:
            self._log(step, Phase.COMPENSATION, "succeeded", self.record.step_started_at)
            self.record.completed_steps.pop()
            self._compensate_next(attempt=1)

    def on_failure(self, failure: FailureReply) -> None:
        step = self._current()
        reason = f"{step.name}: {failure.reason}"
        self._release_hold()
        if self.record.status is SagaStatus.RUNNING:
            self._log(step, Phase.FORWARD, "failed", self.record.step_started_at, reason)
            if self.saga.after_pivot(step.name):
                self._retry_or_give_up(step, Phase.FORWARD, reason)
            elif failure.code == DEAD_LETTERED and _holds_dead_letters(step):
                self._hold(step, reason)
            elif failure.code in (DEAD_LETTERED, PURGED):
                self._compensate_in_doubt(step, reason)
            else:
                self._begin_compensation(reason, step)
        else:
            self._log(step, Phase.COMPENSATION, "failed", self.record.step_started_at, reason)
            if failure.code == DEAD_LETTERED:
                self._give_up(step, Phase.COMPENSATION, reason)
            else:
                self._retry_or_give_up(step, Phase.COMPENSATION, reason)

    def on_timer(self, timer: StepTimer) -> None:
        step = self.saga.step(timer.step)
        if timer.phase == Phase.FORWARD:
            self._send_forward(step, timer.attempt)
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
            self._send_forward(self._current(), attempt=1)
            return True
        if record.status.finished or record.pending_message_id is None or record.step is None:
            return False
        # Stuck waiting: send the pending request again under the same message id, so a
        # participant that did handle it answers it again with its kept reply (inbox) and
        # one that did not handles it now.
        step = self._current()
        if isinstance(step, WaitStep):
            return False  # waiting for an event is not stuck: signal it
        if record.status is SagaStatus.RUNNING:
            self._send_forward(step, record.step_attempt, message_id=record.pending_message_id)
        elif isinstance(step, RemoteStep) and step.compensation is not None:
            self._send_compensation(step, record.step_attempt, message_id=record.pending_message_id)
        else:
            self._compensate_next(attempt=record.step_attempt)
        return True

    # -- waiting for events, timeouts and deadlines ----------------------------

    def _start_wait(self, step: WaitStep) -> None:
        record = self.record
        record.status = SagaStatus.RUNNING
        record.step = step.name
        record.step_attempt = 1
        record.step_started_at = self.at
        record.waiting_for = step.event
        record.wait_schema = _schema(step.payload)
        if (key := step.key_of_data(self.data)) is not None:  # an early event may end it now
            self.started_wait = (step.event, key)
        record.wait_key = key
        if step.timeout is None:
            record.pending_message_id = self.new_id()  # only a signal will end this wait
            record.wait_deadline = None
            return
        timeout = self.envelopes.control(WaitTimeout(saga_id=record.id, step=step.name), step)
        self.outgoing.append(OutgoingMessage(timeout, self.home_service, step.timeout))
        record.pending_message_id = timeout.message_id
        record.wait_deadline = record.step_started_at + step.timeout

    def _end_wait(self) -> None:
        self.record.waiting_for = None
        self.record.wait_schema = None
        self.record.wait_key = None
        self.record.wait_deadline = None

    def on_signal(self, signal: Signal) -> str | None:
        """Apply ``signal``; return why it was refused (then nothing is changed)."""
        record = self.record
        step = self.saga.step(record.step) if record.step else None
        if (
            record.status is not SagaStatus.RUNNING
            or not isinstance(step, WaitStep)
            or record.waiting_for != signal.event
        ):
            waiting = f"waiting for {record.waiting_for!r}" if record.waiting_for else "not waiting"
            return f"saga is {record.status.value} and {waiting}"
        event = step.payload.model_validate(signal.data)
        try:
            result = step.on_event(self.data, event) if step.on_event else None
        except StepFailed as failure:
            reason = f"{step.name}: {failure.reason}"
            if self.saga.after_pivot(step.name):  # past the pivot the saga only goes forward
                return f"{reason}; past the pivot, so the saga keeps waiting"
            self._end_wait()
            self._log(step, Phase.FORWARD, "failed", record.step_started_at, reason)
            self._begin_compensation(reason, step)
            return None
        self._end_wait()
        if result is not None:
            self._set_data(result, f"on_event of {step.name!r}")
        self._log(step, Phase.FORWARD, "succeeded", record.step_started_at)
        record.completed_steps.append(step.name)
        self._go_on(self.saga.index(step.name) + 1)
        return None

    def on_wait_timeout(self) -> None:
        step = self._current()
        assert isinstance(step, WaitStep)
        reason = f"{step.name}: no {step.event!r} within {step.timeout}"
        self._log(step, Phase.FORWARD, "timed_out", self.record.step_started_at, reason)
        self._end_wait()
        if step.on_timeout == COMPENSATE:
            self._begin_compensation(reason, step)
        else:
            self._go_on(self.saga.index(step.on_timeout))

    def on_deadline(self, deadline: StepDeadline) -> None:
        step = self._current()
        assert isinstance(step, RemoteStep)
        reason = f"{step.name}: no reply within {step.deadline}"
        self._log(step, Phase.FORWARD, "deadline_exceeded", self.record.step_started_at, reason)
        retry = self.saga.retry_for(step)
        if step.on_deadline == RETRY and deadline.attempt < retry.attempts:
            self._send_forward(step, deadline.attempt + 1, message_id=deadline.awaited)
        elif self.saga.after_pivot(step.name):
            self._give_up(step, Phase.FORWARD, reason)
        else:
            self._compensate_in_doubt(step, reason)

    # -- steps whose outcome is unknown -----------------------------------------

    def _compensate_in_doubt(self, step: Step, reason: str) -> None:
        """Compensate, this step included: its command may have had its effect (the
        participant gave up after technical failures, or never answered in time)."""
        self.record.completed_steps.append(step.name)
        self._begin_compensation(reason, step)

    def _hold(self, step: Step, reason: str) -> None:
        """Keep the saga at ``step`` until the operator replays or purges its dead letter.

        The pending message id stays: the replayed command keeps it, so its reply is the
        one this saga waits for; a purge answers with a ``purged`` failure under it.
        """
        record = self.record
        record.status = SagaStatus.STEP_DEAD_LETTERED
        record.last_error = reason
        note = "held: replay the dead letter to go on, or purge it to compensate"
        self._log(step, Phase.FORWARD, "held", self.at, note)
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
        """A success for a step the saga already compensated past: send its compensation.

        Happens when a command ran after the saga gave up on it (a slow redelivery, a
        replay on a participant that keeps no closed-step record). The compensation is
        sent under the step's usual compensation key, so it applies at most once.
        Returns False when there is nothing to undo (the step is still to be
        compensated in order, it has no compensation, or the saga did not compensate).
        """
        record = self.record
        compensated_states = (
            SagaStatus.COMPENSATING,
            SagaStatus.COMPENSATED,
            SagaStatus.COMPENSATION_FAILED,
        )
        if record.status not in compensated_states or step_name in record.completed_steps:
            return False
        step = next((s for s in self.saga.steps if s.name == step_name), None)
        if not isinstance(step, RemoteStep) or step.compensation is None:
            return False
        if step.on_reply is not None:
            self._set_data(step.on_reply(self.data, reply), f"on_reply of {step.name!r}")
        envelope = self.envelopes.compensation(step, self.data)
        self.outgoing.append(OutgoingMessage(envelope, self.saga.compensation_service(step)))
        note = f"succeeded after the saga compensated past it; compensation {envelope.type} sent"
        self._log(step, Phase.FORWARD, "late_success", self.at, note)
        logger.warning(
            "saga %s: late success of step %s undone",
            record.id,
            step.name,
            extra={"saga_id": str(record.id), "step": step.name},
        )
        return True

    # -- moving forward ------------------------------------------------------

    def advance(self, index: int) -> None:
        """Run steps from ``index`` on: local ones now, up to the next remote one."""
        for step in self.saga.steps[index:]:
            if step.when is not None and not step.when(self.data):
                self._log(step, Phase.FORWARD, "skipped", self.at, attempt=1)
                continue
            if isinstance(step, RemoteStep):
                self._send_forward(step, attempt=1)
                return
            if isinstance(step, WaitStep):
                self._start_wait(step)
                return
            if not self._run_local(step):
                return
        self.record.status = SagaStatus.COMPLETED
        self.record.step = None
        self.record.pending_message_id = None

    def _go_on(self, index: int) -> None:
        """Go on from step ``index`` now the current step is answered (by a reply, a signal
        or a timeout), or compensate instead if a cancel was requested meanwhile."""
        if self.record.cancel_requested:
            answered = self.saga.step(self.record.step) if self.record.step else None
            self._begin_compensation(self.record.last_error or "cancelled", answered)
        else:
            self.advance(index)

    def _run_local(self, step: LocalStep) -> bool:
        ran = self.local_steps.run(step.action, self.data, compensation=False)
        if isinstance(ran.error, StepFailed):
            reason = f"{step.name}: {ran.error.reason}"
            self._log(step, Phase.FORWARD, "failed", ran.started, reason, ran.finished, 1)
            if self.saga.after_pivot(step.name):
                raise RuntimeError(
                    f"step {step.name!r} is after the pivot and may not fail: {reason}"
                ) from ran.error
            self._begin_compensation(reason, step)
            return False
        if ran.result is not None:
            self._set_data(ran.result, f"step {step.name!r}")
        self._log(step, Phase.FORWARD, "succeeded", ran.started, None, ran.finished, 1)
        self.record.completed_steps.append(step.name)
        return True

    def _send_forward(self, step: Step, attempt: int, message_id: UUID | None = None) -> None:
        assert isinstance(step, RemoteStep)
        envelope = self.envelopes.command(step, self.data, message_id)
        self._sent(envelope, self.saga.service_of(step), step.name, attempt)
        self.record.status = SagaStatus.RUNNING
        if step.deadline is not None:
            awaited = self.record.pending_message_id
            assert awaited is not None
            timer = StepDeadline(
                saga_id=self.record.id, step=step.name, awaited=awaited, attempt=attempt
            )
            envelope = self.envelopes.control(timer, step)
            self.outgoing.append(OutgoingMessage(envelope, self.home_service, step.deadline))

    def _send_compensation(
        self, step: RemoteStep, attempt: int, message_id: UUID | None = None
    ) -> None:
        envelope = self.envelopes.compensation(step, self.data, message_id)
        self._sent(envelope, self.saga.compensation_service(step), step.name, attempt)

    # -- compensating ---------------------------------------------------------

    def _begin_compensation(self, reason: str, cause: Step | None) -> None:
        """Compensate because of ``cause`` (the step that failed, or was answered when a
        cancel was waiting), kept as the saga's ``failed_step``."""
        self.record.status = SagaStatus.COMPENSATING
        self.record.last_error = reason
        self.record.failed_step = cause.name if cause is not None else None
        self._compensate_next(attempt=1)

    def _compensate_next(self, attempt: int) -> None:
        completed = self.record.completed_steps
        while completed:
            step = self.saga.step(completed[-1])
            if isinstance(step, RemoteStep):
                if step.compensation is None:
                    completed.pop()
                    continue
                self._send_compensation(step, attempt)
                return
            action = self.saga.local_compensation_for(step) if isinstance(step, LocalStep) else None
            if action is None:
                completed.pop()
                continue
            ran = self.local_steps.run(action, self.data, compensation=True)
            if ran.error is not None:
                exc = ran.error
                reason = f"{step.name}: {type(exc).__name__}: {exc}"
                self._log(step, Phase.COMPENSATION, "failed", ran.started, reason, ran.finished,
                          attempt)  # fmt: skip
                self.record.step = step.name
                self.record.step_attempt = attempt
                self._retry_or_give_up(step, Phase.COMPENSATION, reason)
                return
            self._log(step, Phase.COMPENSATION, "succeeded", ran.started, None, ran.finished,
                      attempt)  # fmt: skip
            completed.pop()
            attempt = 1
        self.record.status = SagaStatus.COMPENSATED
        self.record.step = None
        self.record.pending_message_id = None

    # -- retries and giving up -----------------------------------------------

    def _retry_or_give_up(self, step: Step, phase: Phase, reason: str) -> None:
        attempt = self.record.step_attempt
        retry = self.saga.retry_for(step)
        if attempt >= retry.attempts:
            self._give_up(step, phase, reason)
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

    def _give_up(self, step: Step, phase: Phase, reason: str) -> None:
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

    def _sent(self, envelope: Envelope, service: str, step: str, attempt: int) -> None:
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

    def _set_data(self, value: object, where: str) -> None:
        if not isinstance(value, self.saga.data_model):
            raise ConfigurationError(
                f"{where} returned {type(value).__name__}; it must return "
                f"{self.saga.data_model.__name__} (or None to keep the data)"
            )
        self.data = value

    def _log(
        self,
        step: Step,
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
                message_id=self.record.pending_message_id if isinstance(step, RemoteStep) else None,
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


def _holds_dead_letters(step: Step) -> bool:
    return isinstance(step, RemoteStep) and step.on_dead_letter == HOLD
