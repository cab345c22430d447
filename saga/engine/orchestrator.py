"""Moving saga instances through their steps, one transaction at a time.

Every entry point (start, a reply, a retry timer, a cancel request) loads the
saga row, runs what it can in the caller's transaction (local steps in
savepoints), queues the next command in the outbox and saves the row with an
optimistic ``WHERE version = n``. A lost race raises
:class:`~saga.errors.ConcurrentUpdate`, which the consumer runtime retries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ValidationError

from saga.db.sql import AsyncTx, Tx
from saga.engine.definition import LocalAction, Saga
from saga.engine.event_waits import EventDelivery, EventWaits
from saga.engine.home import SagaHome
from saga.engine.staged_writes import StagedSagaWrites, opened_record
from saga.engine.staleness import (
    awaits,
    awaits_reply,
    deadline_applies,
    may_undo,
    wait_timeout_applies,
)
from saga.engine.state import Phase, SagaRecord, SagaStatus, StepLogEntry, data_fingerprint
from saga.engine.store import AsyncSagaStore, SagaStore
from saga.engine.transition_results import LocalOutcome
from saga.engine.transitions import Transition
from saga.errors import (
    ConfigurationError,
    IdempotencyKeyReused,
    IdempotencyKeyTaken,
    NeedsSavepoint,
    NotCancellable,
    SagaError,
    StaleReply,
    StepFailed,
    UnknownSaga,
)
from saga.faults import fault_point
from saga.messaging.control import (
    FailureReply,
    ResumeSaga,
    Signal,
    StartSaga,
    StepDeadline,
    StepTimer,
    WaitTimeout,
)
from saga.messaging.envelope import STEP_HEADER, Envelope
from saga.messaging.ids import uuid7
from saga.messaging.leases import active_leases
from saga.observability import tracing
from saga.observability.metrics import Metrics

logger = logging.getLogger(__name__)


#: Looks a saga definition up by name and version (the latest when version is None).
Definitions = Callable[[str, int | None], Saga[Any]]


class Orchestrator:
    """Runs the sagas of one registry against its home database."""

    def __init__(self, home: SagaHome, definitions: Definitions) -> None:
        self.home = home
        self.definitions = definitions
        self.store = home.store
        self.async_store = AsyncSagaStore(self.store)
        #: published events, to the sagas waiting for them (or kept for those that will)
        self.events = EventDelivery(EventWaits(home.schema), self._read, self._definition,
                                    self._signalled)  # fmt: skip
        #: What time it is for the sagas' transitions and step log (saga.testing's virtual
        #: clock replaces it; the timers themselves are delayed outbox rows).
        self.clock: Callable[[], datetime] = now

    # -- entry points --------------------------------------------------------

    def start(
        self,
        tx: Tx,
        saga: Saga[Any],
        data: BaseModel,
        idempotency_key: str | None = None,
    ) -> UUID:
        """Start a saga in ``tx``: its first steps run now, and the row is written as they
        leave it, in one insert. A start whose idempotency key is taken returns the existing
        saga's id, running no local step (or undoing those it ran, when the key was taken
        meanwhile); it raises :class:`IdempotencyKeyReused` if that saga started with
        other data."""
        record = self._new_record(saga, data, idempotency_key, pending=None)
        fingerprint = _fingerprint(record, idempotency_key)
        if idempotency_key is not None:  # a retried request: its local steps must not run again
            existing = self.store.find_by_key(tx, saga.name, idempotency_key)
            if existing is not None:
                return _same_request(saga, idempotency_key, fingerprint, *existing)
        attributes = {tracing.SAGA_ID: record.id, tracing.SAGA_NAME: saga.name}
        try:
            with (
                tracing.span(f"saga {saga.name} start", attributes=attributes),
                self._transition(tx, saga, record, cause=None) as run,
            ):
                run.advance(0)
                result = run.result()
                if not self.home.start(
                    tx, result.record, fingerprint, result.log, result.outgoing, result.dead_letters
                ):
                    raise IdempotencyKeyTaken
                if result.started_wait is not None:
                    self.events.deliver_early(tx, result.record, result.started_wait, None, None)
        except IdempotencyKeyTaken:
            assert idempotency_key is not None
            existing = self.store.find_by_key(tx, saga.name, idempotency_key)
            if existing is None:  # the other starter rolled back meanwhile: try again
                return self.start(tx, saga, data, idempotency_key)
            return _same_request(saga, idempotency_key, fingerprint, *existing)
        return record.id

    async def start_async(
        self,
        tx: AsyncTx,
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
        record = self._new_record(saga, data, idempotency_key, kick.message_id, saga_id)
        fingerprint = _fingerprint(record, idempotency_key)
        if not await self.async_store.insert(tx, record, fingerprint):
            assert idempotency_key is not None
            existing = await self.async_store.find_by_key(tx, saga.name, idempotency_key)
            if existing is None:  # the other starter rolled back meanwhile: try again
                return await self.start_async(tx, saga, data, idempotency_key)
            return _same_request(saga, idempotency_key, fingerprint, *existing)
        await self.home.outbox.add_async(tx, kick, destination=self.home.service_name)
        return saga_id

    def on_start(
        self,
        tx: Tx,
        request: StartSaga,
        metrics: Metrics | None = None,
        batch: StagedSagaWrites | None = None,
    ) -> None:
        """Run the first steps of a saga recorded by :meth:`start_async`."""
        record = self._load(tx, request.saga_id, batch)
        with self._transition(tx, self._definition(record), record, None, batch) as run:
            begun = run.begin()
            if begun:
                self._apply(tx, run, metrics, batch)
        if not begun:
            logger.debug("saga %s has already begun; start ignored", record.id,
                         extra={"saga_id": str(record.id)})  # fmt: skip

    def on_reply(
        self,
        tx: Tx,
        reply: BaseModel,
        envelope: Envelope,
        metrics: Metrics | None = None,
        batch: StagedSagaWrites | None = None,
    ) -> None:
        record = self._load_for(tx, envelope.saga_id, envelope, batch)
        if not awaits_reply(record, envelope):
            self._late_reply(tx, record, reply, envelope, metrics, batch)
            return
        with self._transition(tx, self._definition(record), record, envelope, batch) as run:
            if isinstance(reply, FailureReply):
                run.on_failure(reply)
            else:
                run.on_success(reply)
            self._apply(tx, run, metrics, batch)

    def on_timer(
        self,
        tx: Tx,
        timer: StepTimer,
        envelope: Envelope,
        metrics: Metrics | None = None,
        batch: StagedSagaWrites | None = None,
    ) -> None:
        record = self._waiting(tx, timer.saga_id, envelope.message_id, envelope, batch)
        with self._transition(tx, self._definition(record), record, envelope, batch) as run:
            run.on_timer(timer)
            self._apply(tx, run, metrics, batch)

    def on_signal(
        self,
        tx: Tx,
        signal: Signal,
        metrics: Metrics | None = None,
        batch: StagedSagaWrites | None = None,
    ) -> None:
        record = self._load(tx, signal.saga_id, batch)
        self._signalled(tx, record, signal, "signal", metrics, batch)

    def on_wait_timeout(
        self,
        tx: Tx,
        timeout: WaitTimeout,
        envelope: Envelope,
        metrics: Metrics | None = None,
        batch: StagedSagaWrites | None = None,
    ) -> None:
        record = self._load(tx, timeout.saga_id, batch)
        if not wait_timeout_applies(record, envelope):
            # A signal (or an operator) got there first: the timeout loses, and says so.
            self._ignored(
                tx, record, timeout.step, "timeout lost the race: the saga moved on", batch
            )
            return
        with self._transition(tx, self._definition(record), record, envelope, batch) as run:
            run.on_wait_timeout()
            self._apply(tx, run, metrics, batch)

    def on_deadline(
        self,
        tx: Tx,
        deadline: StepDeadline,
        envelope: Envelope,
        metrics: Metrics | None = None,
        batch: StagedSagaWrites | None = None,
    ) -> None:
        record = self._load(tx, deadline.saga_id, batch)
        if not deadline_applies(record, deadline):
            logger.debug("deadline of %s passed after its reply; nothing to do", deadline.step)
            return
        with self._transition(tx, self._definition(record), record, envelope, batch) as run:
            run.on_deadline(deadline)
            self._apply(tx, run, metrics, batch)

    def cancel(self, tx: Tx, saga_id: UUID, reason: str) -> None:
        request_cancel(self.store, tx, saga_id, reason)

    async def cancel_async(self, tx: AsyncTx, saga_id: UUID, reason: str) -> None:
        if not await self.async_store.request_cancel(tx, saga_id, reason):
            raise _cancel_refused(saga_id, await self.async_store.load(tx, saga_id))

    def on_resume(
        self,
        tx: Tx,
        request: ResumeSaga,
        metrics: Metrics | None = None,
        batch: StagedSagaWrites | None = None,
    ) -> None:
        record = self._read(tx, request.saga_id, batch)
        if record is None:
            raise UnknownSaga(f"cannot resume unknown saga {request.saga_id}")
        with self._transition(tx, self._definition(record), record, None, batch) as run:
            resumed = run.resume()
            if resumed:
                self._apply(tx, run, metrics, batch)
        if resumed:
            logger.warning(
                "saga %s resumed at step %s (%s): %s",
                record.id,
                record.step,
                record.status.value,
                request.reason,
                extra={"saga_id": str(record.id), "step": record.step},
            )
        else:
            logger.warning(
                "saga %s is %s with nothing pending; resume ignored",
                record.id,
                record.status.value,
                extra={"saga_id": str(record.id)},
            )

    # -- helpers -------------------------------------------------------------

    def _new_record(
        self,
        saga: Saga[Any],
        data: BaseModel,
        idempotency_key: str | None,
        pending: UUID | None,
        saga_id: UUID | None = None,
    ) -> SagaRecord:
        """The record of a new running saga, its data checked, nothing run yet."""
        if not isinstance(data, saga.data_model):
            raise ConfigurationError(
                f"saga {saga.name!r} takes {saga.data_model.__name__}, not {type(data).__name__}"
            )
        saga.check_data(data)
        return SagaRecord.new(
            saga_id or uuid7(),
            saga.name,
            saga.version,
            self.home.service_name,
            data.model_dump(mode="json"),
            idempotency_key=idempotency_key,
            pending_message_id=pending,
        )

    def _read(self, tx: Tx, saga_id: UUID, batch: StagedSagaWrites | None) -> SagaRecord | None:
        """The saga's row: from the batch's read (a copy), as the delivery's opening statement
        read it, or read now."""
        if batch is not None:
            return batch.record(tx, saga_id)
        return opened_record(saga_id) or self.store.load(tx, saga_id)

    def _load(self, tx: Tx, saga_id: UUID, batch: StagedSagaWrites | None) -> SagaRecord:
        record = self._read(tx, saga_id, batch)
        if record is None:
            raise UnknownSaga(f"no saga {saga_id}")
        return record

    def _ignored(
        self,
        tx: Tx,
        record: SagaRecord,
        step: str,
        reason: str,
        batch: StagedSagaWrites | None,
    ) -> None:
        """Record, without touching the saga, an event that arrived too late to matter."""
        moment = self.clock()
        entry = StepLogEntry(
            record.id, step, Phase.FORWARD, record.step_attempt, "ignored", moment, moment, reason
        )
        if batch is not None:
            batch.stage_log([entry])
        else:
            self.store.log(tx, [entry])
        logger.info("saga %s: %s ignored: %s", record.id, step, reason,
                    extra={"saga_id": str(record.id), "step": step})  # fmt: skip

    def _late_reply(
        self,
        tx: Tx,
        record: SagaRecord,
        reply: BaseModel,
        envelope: Envelope,
        metrics: Metrics | None,
        batch: StagedSagaWrites | None,
    ) -> None:
        """A reply the saga no longer waits for: undo a late success, record the rest.

        Never an error: retrying it cannot make the saga wait for it again, and a
        success that came after the saga compensated past its step must be undone.
        """
        step = envelope.headers.get(STEP_HEADER) or "(reply)"
        if may_undo(reply, envelope):
            with self._transition(tx, self._definition(record), record, envelope, batch) as run:
                undone = run.undo_late_success(step, reply)
                if undone:
                    self._apply(tx, run, metrics, batch)
            if undone:
                return
        what = f"{envelope.type} {envelope.message_id}"
        if isinstance(reply, FailureReply):
            what += f" ({reply.code or 'failure'}: {reply.reason})"
        self._ignored(tx, record, step, f"{what} came after the saga moved on", batch)

    def _load_for(
        self,
        tx: Tx,
        saga_id: UUID | None,
        envelope: Envelope,
        batch: StagedSagaWrites | None,
    ) -> SagaRecord:
        if saga_id is None:
            raise UnknownSaga(f"{envelope.type} {envelope.message_id} carries no saga_id")
        record = self._read(tx, saga_id, batch)
        if record is None:
            raise UnknownSaga(
                f"{envelope.type} {envelope.message_id} is for unknown saga {saga_id}"
            )
        return record

    def _waiting(
        self,
        tx: Tx,
        saga_id: UUID | None,
        awaited: UUID | None,
        envelope: Envelope,
        batch: StagedSagaWrites | None,
    ) -> SagaRecord:
        record = self._load_for(tx, saga_id, envelope, batch)
        if not awaits(record, awaited):
            raise StaleReply(
                f"saga {saga_id} ({record.status}, step {record.step!r}) is not waiting for "
                f"{envelope.type} {envelope.message_id}"
            )
        return record

    def _signalled(
        self,
        tx: Tx,
        record: SagaRecord,
        signal: Signal,
        what: str,
        metrics: Metrics | None,
        batch: StagedSagaWrites | None,
    ) -> bool:
        """Apply ``signal`` (a signal, or a published event as one), or record why not;
        False when the saga refused it."""
        with self._transition(tx, self._definition(record), record, None, batch) as run:
            try:
                refused = run.on_signal(signal)
            except ValidationError as exc:
                refused = f"invalid {signal.event} data: {exc.errors(include_url=False)[:3]}"
            if not refused:
                self._apply(tx, run, metrics, batch)
        if refused:
            self._ignored(tx, record, f"{what} {signal.event}", refused, batch)
        return not refused

    def _definition(self, record: SagaRecord) -> Saga[Any]:
        """The definition ``record`` runs under (its name and version)."""
        return self.definitions(record.name, record.saga_version)

    @contextmanager
    def _transition(
        self,
        tx: Tx,
        saga: Saga[Any],
        record: SagaRecord,
        cause: Envelope | None,
        batch: StagedSagaWrites | None = None,
    ) -> Iterator[Transition]:
        """A transition of ``record`` now; the local steps it runs are undone if it fails."""
        steps = SavepointSteps(tx, self.clock, guarded=batch is None or batch.guarded)
        try:
            yield Transition(
                saga,
                record,
                cause=cause,
                at=self.clock(),
                home_service=self.home.service_name,
                local_steps=steps,
            )
        except BaseException:
            steps.undo()
            raise

    def _apply(
        self,
        tx: Tx,
        transition: Transition,
        metrics: Metrics | None,
        batch: StagedSagaWrites | None = None,
    ) -> None:
        """Write (or, in a batch, stage) what ``transition`` decided; count ended sagas."""
        result = transition.result()
        if batch is not None:
            batch.stage(result, transition.saga.name, metrics)
        else:
            leases = active_leases()
            standing = (
                leases.standing_writes() if leases and leases.savepoint_free else nullcontext()
            )
            with standing:
                self.home.persist(
                    tx, [result.record], result.log, result.outgoing, result.dead_letters
                )
            if metrics is not None and result.ended is not None:
                metrics.saga_outcomes.labels(transition.saga.name, result.ended.value).inc()
        if result.started_wait is not None:
            self.events.deliver_early(tx, result.record, result.started_wait, metrics, batch)


def now() -> datetime:
    return datetime.now(UTC)


class SavepointSteps:
    """Runs local steps on the orchestrator's transaction, each in its own savepoint.

    The first local step's savepoint also holds for the whole transition: a transition
    that fails after a local step succeeded rolls that step's writes back with it (a
    batch of the orchestrator's deliveries has no savepoint per delivery); the later
    local steps of the transition take one each. Savepoints are never released (the
    commit ends them all), so a transition that runs no local step sends nothing here,
    and each local step costs one statement.

    Not ``guarded`` (a delivery of a batch handled under its segment's savepoint), local
    steps run with no savepoint at all, and one that raises raises
    :class:`NeedsSavepoint`: the runtime handles the delivery again, guarded.
    """

    def __init__(
        self,
        tx: Tx,
        clock: Callable[[], datetime] = now,
        *,
        guarded: bool = True,
    ) -> None:
        self.tx = tx
        self.clock = clock
        self.guarded = guarded
        self._opened = False

    def run(self, action: LocalAction, data: BaseModel, *, compensation: bool) -> LocalOutcome:
        started = self.clock()
        if not self.guarded:
            try:
                result = self._call(action, data, compensation)
            except Exception as exc:
                raise NeedsSavepoint(f"local step failed: {exc!r}") from exc
            return LocalOutcome(result, None, started, self.clock())
        savepoint = "saga_local_step" if self._opened else "saga_transition"
        self._opened = True
        self.tx.execute(f"SAVEPOINT {savepoint}", prepare=False)
        try:
            result = self._call(action, data, compensation)
        except Exception as exc:
            if not self.tx.broken:
                self.tx.execute(f"ROLLBACK TO SAVEPOINT {savepoint}", prepare=False)
            if isinstance(exc, StepFailed) or compensation:
                return LocalOutcome(None, exc, started, self.clock())
            raise
        return LocalOutcome(result, None, started, self.clock())

    def _call(self, action: LocalAction, data: BaseModel, compensation: bool) -> Any:
        if compensation:
            fault_point("orchestrator.in_compensation")
        return action(self.tx, data)

    def undo(self) -> None:
        """The transition failed: roll its local steps' writes back."""
        if self._opened and not self.tx.broken:
            self.tx.execute("ROLLBACK TO SAVEPOINT saga_transition", prepare=False)


def request_cancel(store: SagaStore, tx: Tx, saga_id: UUID, reason: str) -> None:
    """Ask a running saga to compensate once its pending step answers.

    Refused (:class:`NotCancellable`) for a finished saga or one that reached
    its pivot step, which can only go forward.
    """
    if not store.request_cancel(tx, saga_id, reason):
        raise _cancel_refused(saga_id, store.load(tx, saga_id))


def _fingerprint(record: SagaRecord, idempotency_key: str | None) -> str | None:
    """The fingerprint kept with a start's key: of the data the saga starts with."""
    return data_fingerprint(record.data) if idempotency_key is not None else None


def _same_request(
    saga: Saga[Any], key: str, fingerprint: str | None, saga_id: UUID, kept: str | None
) -> UUID:
    """The id of the saga already started under ``key``, if it started with the same data.

    A key names one request: reused with other data it is a client's mistake, refused
    like a payment API refuses it. (Sagas started before fingerprints were kept have none.)
    """
    if kept is not None and kept != fingerprint:
        raise IdempotencyKeyReused(
            f"saga {saga.name!r}: idempotency key {key!r} already started saga {saga_id} "
            "with other data; a key stands for one request, so use a new key for new data"
        )
    return saga_id


def _cancel_refused(saga_id: UUID, record: SagaRecord | None) -> SagaError:
    """Why a cancel request changed no row."""
    if record is None:
        return UnknownSaga(f"no saga {saga_id}")
    if record.status is not SagaStatus.RUNNING:
        return NotCancellable(
            f"saga {saga_id} is {record.status.value}; only a running saga can be cancelled"
        )
    return NotCancellable(f"saga {saga_id} has reached its pivot step; it can only go forward")
