"""Moving saga instances through their steps, one transaction at a time.

Every entry point (start, a reply, a retry timer, a cancel request) loads the
saga row, runs what it can in the caller's transaction (local steps in
savepoints), queues the next command in the outbox and saves the row with an
optimistic ``WHERE version = n``. A lost race raises
:class:`~saga.errors.ConcurrentUpdate`, which the consumer runtime retries.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg
from pydantic import BaseModel, ValidationError

from saga.engine.definition import Saga
from saga.engine.execution import SagaRun, now
from saga.engine.state import Phase, SagaRecord, SagaStatus, StepLogEntry
from saga.engine.store import AsyncSagaStore, NewSaga, SagaStore
from saga.errors import (
    ConfigurationError,
    NotCancellable,
    SagaError,
    StaleReply,
    UnknownSaga,
)
from saga.messaging.control import (
    FailureReply,
    ResumeSaga,
    Signal,
    StartSaga,
    StepDeadline,
    StepTimer,
    WaitTimeout,
)
from saga.messaging.dead_letters import DeadLetterStore
from saga.messaging.envelope import COMPENSATES_HEADER, STEP_HEADER, Envelope
from saga.messaging.ids import uuid7
from saga.observability import tracing
from saga.observability.metrics import Metrics

if TYPE_CHECKING:
    from saga.engine.registry import SagaRegistry

logger = logging.getLogger(__name__)


class Orchestrator:
    """Runs the sagas of one registry against its home database."""

    def __init__(self, registry: SagaRegistry) -> None:
        self.registry = registry
        self.store = SagaStore(registry.schema)
        self.async_store = AsyncSagaStore(self.store)
        self.dead_letters = DeadLetterStore(registry.schema)

    # -- entry points --------------------------------------------------------

    def start(
        self,
        tx: psycopg.Connection[Any],
        saga: Saga[Any],
        data: BaseModel,
        idempotency_key: str | None = None,
    ) -> UUID:
        saga_id = uuid7()
        inserted = self.store.insert(tx, self._new_saga(saga, data, saga_id, idempotency_key))
        if inserted is None:
            assert idempotency_key is not None
            existing = self.store.find_by_key(tx, saga.name, idempotency_key)
            if existing is None:  # the other starter rolled back meanwhile: try again
                return self.start(tx, saga, data, idempotency_key)
            return existing
        record = self.store.load(tx, saga_id)
        assert record is not None
        with tracing.span(f"saga {saga.name} start", attributes={"saga.id": saga_id}):
            run = SagaRun(self, tx, saga, record, cause=None)
            run.advance(0)
            run.commit()
        return saga_id

    async def start_async(
        self,
        tx: psycopg.AsyncConnection[Any],
        saga: Saga[Any],
        data: BaseModel,
        idempotency_key: str | None = None,
    ) -> UUID:
        """Record a new saga and a :class:`StartSaga` for its home service, in ``tx``.

        The first steps run when the orchestrator handles that message (local
        steps need a synchronous connection); the row shows the saga running
        with the message pending, so ``saga resume`` recovers it if it is lost.
        """
        saga_id = uuid7()
        kick = Envelope.wrap(StartSaga(saga_id=saga_id), saga_id=saga_id, correlation_id=saga_id)
        row = self._new_saga(saga, data, saga_id, idempotency_key)
        inserted = await self.async_store.insert(tx, row, kick.message_id)
        if inserted is None:
            assert idempotency_key is not None
            existing = await self.async_store.find_by_key(tx, saga.name, idempotency_key)
            if existing is None:  # the other starter rolled back meanwhile: try again
                return await self.start_async(tx, saga, data, idempotency_key)
            return existing
        await self.registry.outbox.add_async(tx, kick, destination=self.registry.service_name)
        return saga_id

    def on_start(
        self, tx: psycopg.Connection[Any], request: StartSaga, metrics: Metrics | None = None
    ) -> None:
        """Run the first steps of a saga recorded by :meth:`start_async`."""
        record = self._load(tx, request.saga_id)
        run = self._run(tx, record, None, metrics)
        if run.begin():
            run.commit()
        else:
            logger.debug("saga %s has already begun; start ignored", record.id,
                         extra={"saga_id": str(record.id)})  # fmt: skip

    def on_reply(
        self,
        tx: psycopg.Connection[Any],
        reply: BaseModel,
        envelope: Envelope,
        metrics: Metrics | None = None,
    ) -> None:
        record = self._load_for(tx, envelope.saga_id, envelope)
        if record.pending_message_id is None or record.pending_message_id != envelope.causation_id:
            self._late_reply(tx, record, reply, envelope, metrics)
            return
        run = self._run(tx, record, envelope, metrics)
        if isinstance(reply, FailureReply):
            run.on_failure(reply)
        else:
            run.on_success(reply)
        run.commit()

    def on_timer(
        self,
        tx: psycopg.Connection[Any],
        timer: StepTimer,
        envelope: Envelope,
        metrics: Metrics | None = None,
    ) -> None:
        record = self._waiting(tx, timer.saga_id, envelope.message_id, envelope)
        run = self._run(tx, record, envelope, metrics)
        run.on_timer(timer)
        run.commit()

    def on_signal(
        self, tx: psycopg.Connection[Any], signal: Signal, metrics: Metrics | None = None
    ) -> None:
        record = self._load(tx, signal.saga_id)
        run = self._run(tx, record, None, metrics)
        try:
            refused = run.on_signal(signal)
        except ValidationError as exc:
            refused = f"invalid {signal.event} data: {exc.errors(include_url=False)[:3]}"
        if refused:
            self._ignored(tx, record, f"signal {signal.event}", refused)
        else:
            run.commit()

    def on_wait_timeout(
        self,
        tx: psycopg.Connection[Any],
        timeout: WaitTimeout,
        envelope: Envelope,
        metrics: Metrics | None = None,
    ) -> None:
        record = self._load(tx, timeout.saga_id)
        if record.pending_message_id != envelope.message_id or record.waiting_for is None:
            # A signal (or an operator) got there first: the timeout loses, and says so.
            self._ignored(tx, record, timeout.step, "timeout lost the race: the saga moved on")
            return
        run = self._run(tx, record, envelope, metrics)
        run.on_wait_timeout()
        run.commit()

    def on_deadline(
        self,
        tx: psycopg.Connection[Any],
        deadline: StepDeadline,
        envelope: Envelope,
        metrics: Metrics | None = None,
    ) -> None:
        record = self._load(tx, deadline.saga_id)
        if record.pending_message_id != deadline.awaited or record.status is not SagaStatus.RUNNING:
            logger.debug("deadline of %s passed after its reply; nothing to do", deadline.step)
            return
        run = self._run(tx, record, envelope, metrics)
        run.on_deadline(deadline)
        run.commit()

    def cancel(self, tx: psycopg.Connection[Any], saga_id: UUID, reason: str) -> None:
        request_cancel(self.store, tx, saga_id, reason)

    async def cancel_async(
        self, tx: psycopg.AsyncConnection[Any], saga_id: UUID, reason: str
    ) -> None:
        if not await self.async_store.request_cancel(tx, saga_id, reason):
            raise _cancel_refused(saga_id, await self.async_store.load(tx, saga_id))

    def on_resume(
        self, tx: psycopg.Connection[Any], request: ResumeSaga, metrics: Metrics | None = None
    ) -> None:
        record = self.store.load(tx, request.saga_id)
        if record is None:
            raise UnknownSaga(f"cannot resume unknown saga {request.saga_id}")
        run = self._run(tx, record, None, metrics)
        if run.resume():
            logger.warning(
                "saga %s resumed at step %s (%s): %s",
                record.id,
                record.step,
                record.status.value,
                request.reason,
                extra={"saga_id": str(record.id), "step": record.step},
            )
            run.commit()
        else:
            logger.warning(
                "saga %s is %s with nothing pending; resume ignored",
                record.id,
                record.status.value,
                extra={"saga_id": str(record.id)},
            )

    # -- helpers -------------------------------------------------------------

    def _new_saga(
        self, saga: Saga[Any], data: BaseModel, saga_id: UUID, idempotency_key: str | None
    ) -> NewSaga:
        """The row of a new saga, its data checked."""
        if not isinstance(data, saga.data_model):
            raise ConfigurationError(
                f"saga {saga.name!r} takes {saga.data_model.__name__}, not {type(data).__name__}"
            )
        saga.check_data_size(data)
        dumped = data.model_dump(mode="json")
        service = self.registry.service_name
        return NewSaga(saga_id, saga.name, saga.version, service, dumped, idempotency_key)

    def _load(self, tx: psycopg.Connection[Any], saga_id: UUID) -> SagaRecord:
        record = self.store.load(tx, saga_id)
        if record is None:
            raise UnknownSaga(f"no saga {saga_id}")
        return record

    def _ignored(
        self, tx: psycopg.Connection[Any], record: SagaRecord, step: str, reason: str
    ) -> None:
        """Record, without touching the saga, an event that arrived too late to matter."""
        moment = now()
        self.store.log(
            tx,
            [
                StepLogEntry(
                    record.id,
                    step,
                    Phase.FORWARD,
                    record.step_attempt,
                    "ignored",
                    moment,
                    moment,
                    reason,
                )
            ],
        )
        logger.info("saga %s: %s ignored: %s", record.id, step, reason,
                    extra={"saga_id": str(record.id), "step": step})  # fmt: skip

    def _late_reply(
        self,
        tx: psycopg.Connection[Any],
        record: SagaRecord,
        reply: BaseModel,
        envelope: Envelope,
        metrics: Metrics | None,
    ) -> None:
        """A reply the saga no longer waits for: undo a late success, record the rest.

        Never an error: retrying it cannot make the saga wait for it again, and a
        success that came after the saga compensated past its step must be undone.
        """
        step = envelope.headers.get(STEP_HEADER) or "(reply)"
        is_compensation = COMPENSATES_HEADER in envelope.headers
        if not isinstance(reply, FailureReply) and not is_compensation:
            run = self._run(tx, record, envelope, metrics)
            if run.undo_late_success(step, reply):
                run.commit()
                return
        what = f"{envelope.type} {envelope.message_id}"
        if isinstance(reply, FailureReply):
            what += f" ({reply.code or 'failure'}: {reply.reason})"
        self._ignored(tx, record, step, f"{what} came after the saga moved on")

    def _load_for(
        self, tx: psycopg.Connection[Any], saga_id: UUID | None, envelope: Envelope
    ) -> SagaRecord:
        if saga_id is None:
            raise UnknownSaga(f"{envelope.type} {envelope.message_id} carries no saga_id")
        record = self.store.load(tx, saga_id)
        if record is None:
            raise UnknownSaga(
                f"{envelope.type} {envelope.message_id} is for unknown saga {saga_id}"
            )
        return record

    def _waiting(
        self,
        tx: psycopg.Connection[Any],
        saga_id: UUID | None,
        awaited: UUID | None,
        envelope: Envelope,
    ) -> SagaRecord:
        record = self._load_for(tx, saga_id, envelope)
        if record.pending_message_id is None or record.pending_message_id != awaited:
            raise StaleReply(
                f"saga {saga_id} ({record.status}, step {record.step!r}) is not waiting for "
                f"{envelope.type} {envelope.message_id}"
            )
        return record

    def _run(
        self,
        tx: psycopg.Connection[Any],
        record: SagaRecord,
        cause: Envelope | None,
        metrics: Metrics | None,
    ) -> SagaRun:
        """A run of ``record`` under the definition of its name and version."""
        saga = self.registry.definition(record.name, record.saga_version)
        return SagaRun(self, tx, saga, record, cause=cause, metrics=metrics)


def request_cancel(
    store: SagaStore, tx: psycopg.Connection[Any], saga_id: UUID, reason: str
) -> None:
    """Ask a running saga to compensate once its pending step answers.

    Refused (:class:`NotCancellable`) for a finished saga or one that reached
    its pivot step, which can only go forward.
    """
    if not store.request_cancel(tx, saga_id, reason):
        raise _cancel_refused(saga_id, store.load(tx, saga_id))


def _cancel_refused(saga_id: UUID, record: SagaRecord | None) -> SagaError:
    """Why a cancel request changed no row."""
    if record is None:
        return UnknownSaga(f"no saga {saga_id}")
    if record.status is not SagaStatus.RUNNING:
        return NotCancellable(
            f"saga {saga_id} is {record.status.value}; only a running saga can be cancelled"
        )
    return NotCancellable(f"saga {saga_id} has reached its pivot step; it can only go forward")
