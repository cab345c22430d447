"""The registry: the sagas whose home is one service, run as that service's consumer.

>>> registry = SagaRegistry("orders")                 # doctest: +SKIP
>>> registry.register(create_order)
>>> # saga consume orders.saga:registry
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg
from pydantic import BaseModel, ValidationError

from saga.db.sql import AsyncTx, Tx
from saga.engine import fingerprints, signals
from saga.engine.definition import Saga, WaitStep
from saga.engine.home import SagaHome
from saga.engine.orchestrator import Orchestrator
from saga.engine.reply_joins import ReplyJoins
from saga.engine.staged_writes import SagaBatchWriting, StagedSagaWrites
from saga.engine.state import Phase, SagaRecord, StepLogEntry
from saga.errors import ConfigurationError, SignalRejected
from saga.handlers.retry import RetryPolicy
from saga.handlers.service import Handler, Service
from saga.messaging.control import (
    Ack,
    FailureReply,
    ResumeSaga,
    Signal,
    StartSaga,
    StepDeadline,
    StepTimer,
    WaitTimeout,
)
from saga.messaging.envelope import message_type_of
from saga.messaging.outbox import Outbox

if TYPE_CHECKING:
    from saga.handlers.context import HandlerContext


@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What ``migrate_instances`` did (or, dry, would do), per older version."""

    moved: dict[int, int]
    stayed: dict[int, int]


class SagaRegistry:
    """Collects saga definitions and runs them as the ``service`` consumer.

    ``routes`` maps command types to the services that handle them, for
    remote steps declared without ``service=``.
    """

    def __init__(
        self,
        service: str,
        *,
        schema: str = "saga",
        routes: dict[type[BaseModel], str] | None = None,
        retry: RetryPolicy | None = None,
        outbox: Outbox | None = None,
    ) -> None:
        self.home = SagaHome(service, schema, outbox)
        self.service_name = self.home.service_name
        self.schema = self.home.schema
        self.routes = dict(routes or {})
        self.retry = retry or RetryPolicy()
        self.outbox = self.home.outbox
        self._sagas: dict[str, dict[int, Saga[Any]]] = {}
        self._internal: dict[type[BaseModel], Handler] = {
            StepTimer: self._on_timer,
            StartSaga: self._on_start,
            ResumeSaga: self._on_resume,
            Signal: self._on_signal,
            WaitTimeout: self._on_wait_timeout,
            StepDeadline: self._on_deadline,
        }
        built_in: list[type[BaseModel]] = [Ack, FailureReply, *self._internal]
        self._reply_types: dict[str, type[BaseModel]] = {message_type_of(m): m for m in built_in}
        #: published event type -> its class and the wait steps (of any saga) waiting for it
        self._events: dict[str, tuple[type[BaseModel], list[WaitStep]]] = {}
        self.orchestrator: Orchestrator = Orchestrator(self.home, self.definition)
        self._service: Service | None = None

    def __repr__(self) -> str:
        return f"SagaRegistry({self.service_name!r}, sagas={sorted(self._sagas)})"

    def register(self, saga: Saga[Any]) -> Saga[Any]:
        """Check ``saga`` and make it runnable here; every mistake is reported now."""
        if self._service is not None:
            raise ConfigurationError("register every saga before the registry's service starts")
        saga.validate(self.routes)
        versions = self._sagas.setdefault(saga.name, {})
        if saga.version in versions:
            raise ConfigurationError(
                f"saga {saga.name!r} version {saga.version} is registered twice"
            )
        replies = [reply for step in saga.steps for reply in step.expects()]
        for reply in replies:
            name = message_type_of(reply)
            known = self._reply_types.get(name) or self._events.get(name, (None,))[0]
            if known is not None and known is not reply:
                raise ConfigurationError(
                    f"reply type name {name!r} is used by two classes ({known!r} and {reply!r}); "
                    "set message_type on one of them"
                )
        for reply in replies:
            self._reply_types[message_type_of(reply)] = reply
        self._add_event_waits(saga)
        for other in versions.values():
            newer, older = (saga, other) if saga.version > other.version else (other, saga)
            newer.validate_migration(older)
        versions[saga.version] = saga
        saga.registry = self
        return saga

    def _add_event_waits(self, saga: Saga[Any]) -> None:
        """Subscribe (when the service starts) to the events ``saga``'s wait steps wait for."""
        for step in (wait for kind in saga.steps for wait in kind.event_waits()):
            event_class, steps = self._events.setdefault(step.event, (step.payload, []))
            clash = self._reply_types.get(step.event)
            if event_class is not step.payload or clash is not None:
                other = clash or event_class
                raise ConfigurationError(
                    f"saga {saga.name!r} step {step.name!r} waits for the event {step.event!r}, "
                    f"a name {other!r} uses too; set message_type on one of them"
                )
            steps.append(step)

    @property
    def awaited_events(self) -> list[str]:
        """The published events the registered sagas wait for (the service subscribes)."""
        return sorted(self._events)

    def definition(self, name: str, version: int | None = None) -> Saga[Any]:
        """The registered saga ``name`` at ``version`` (the newest when None)."""
        versions = self._sagas.get(name)
        if not versions:
            raise ConfigurationError(f"no saga named {name!r} is registered with {self!r}")
        if version is None:
            return versions[max(versions)]
        if version not in versions:
            raise ConfigurationError(
                f"saga {name!r} version {version} is not registered (have {sorted(versions)})"
            )
        return versions[version]

    @property
    def sagas(self) -> list[Saga[Any]]:
        return [saga for versions in self._sagas.values() for saga in versions.values()]

    # -- app-facing calls ------------------------------------------------------

    def start(
        self,
        tx: Tx,
        saga: Saga[Any] | str,
        data: BaseModel,
        *,
        idempotency_key: str | None = None,
    ) -> UUID:
        """Start a saga in the caller's transaction; the same key twice gives the same id
        (with other data, :class:`~saga.errors.IdempotencyKeyReused`)."""
        saga_id: UUID = self.orchestrator.start(tx, self._own(saga), data, idempotency_key)
        return saga_id

    async def start_async(
        self,
        tx: AsyncTx,
        saga: Saga[Any] | str,
        data: BaseModel,
        *,
        idempotency_key: str | None = None,
    ) -> UUID:
        """:meth:`start` on an async connection, atomically with the caller's transaction.

        The saga row and a start message are written now; the orchestrator runs
        the first steps (local ones included) when it handles that message.
        """
        definition = self._own(saga)
        return await self.orchestrator.start_async(tx, definition, data, idempotency_key)

    def _own(self, saga: Saga[Any] | str) -> Saga[Any]:
        definition = self.definition(saga) if isinstance(saga, str) else saga
        if definition.registry is not self:
            raise ConfigurationError(f"saga {definition.name!r} is not registered with {self!r}")
        return definition

    def signal(
        self,
        tx: Tx,
        saga_id: UUID,
        event: str,
        data: BaseModel | dict[str, Any],
    ) -> UUID:
        """Deliver ``event`` to a waiting saga, atomically with the caller's transaction.

        Raises :class:`~saga.errors.SignalRejected` (nothing written) for an unknown
        saga, one not waiting for ``event``, or data its wait step does not accept.
        """
        record = self.orchestrator.store.load(tx, saga_id)
        return signals.queue_signal(
            tx, self.outbox, *self._signal_payload(record, saga_id, event, data)
        )

    async def signal_async(
        self,
        tx: AsyncTx,
        saga_id: UUID,
        event: str,
        data: BaseModel | dict[str, Any],
    ) -> UUID:
        """:meth:`signal` on an async connection: the same checks, the same message."""
        record = await self.orchestrator.async_store.load(tx, saga_id)
        message = signals.signal_message(*self._signal_payload(record, saga_id, event, data))
        await self.outbox.add_many_async(tx, [message])
        return message.envelope.message_id

    def _signal_payload(
        self,
        record: SagaRecord | None,
        saga_id: UUID,
        event: str,
        data: BaseModel | dict[str, Any],
    ) -> tuple[SagaRecord, str, dict[str, Any]]:
        """The waiting saga's record, the event, and ``data`` checked by its wait step."""
        record = signals.check_waiting(record, saga_id, event)
        step = self.definition(record.name, record.saga_version).step(record.step or "")
        model = step.signal_payload()
        if model is None:
            raise SignalRejected(f"saga {saga_id} is at step {step.name!r}, which takes no signal")
        try:
            payload = model.model_validate(
                data.model_dump(mode="json") if isinstance(data, BaseModel) else data
            )
        except ValidationError as exc:
            raise SignalRejected(f"invalid {event!r} data for saga {saga_id}: {exc}") from None
        return record, event, payload.model_dump(mode="json")

    def check_versions(self, tx: Tx) -> None:
        """Refuse to run without the definitions that unfinished sagas still need: every
        version they run on registered, as it was when they started (its recorded shape)."""
        unfinished = self.orchestrator.store.unfinished_by_version(tx, list(self._sagas))
        problems = [
            f"saga {name!r} version {version} has {count} unfinished saga(s) but is not "
            "registered; keep that version registered until they finish, or migrate them "
            "(saga migrate-instances)"
            for name, version, count in unfinished
            if version not in self._sagas[name]
        ]
        running = {(name, version): count for name, version, count in unfinished}
        problems += self._changed_definitions(tx, running)
        if problems:
            raise ConfigurationError("; ".join(problems))

    def _changed_definitions(self, tx: Tx, running: dict[tuple[str, int], int]) -> list[str]:
        """Record each version's shape; what changed under a version with unfinished sagas."""
        store = self.orchestrator.store
        recorded = store.recorded_definitions(tx, list(self._sagas))
        problems = []
        for saga in self.sagas:
            steps = fingerprints.shape(saga)
            before = recorded.get((saga.name, saga.version))
            count = running.get((saga.name, saga.version), 0)
            if before is not None and before != steps and count:
                problems.append(
                    f"saga {saga.name!r} version {saga.version} changed without a version bump "
                    f"while {count} saga(s) of it are unfinished: "
                    f"{fingerprints.describe_change(before, steps)}. Give the changed "
                    f"definition version {saga.version + 1} and keep version {saga.version} "
                    "registered as it was until they finish (or move them: saga "
                    "migrate-instances)"
                )
            elif before != steps:
                store.record_definition(
                    tx, saga.name, saga.version, fingerprints.fingerprint(steps), steps
                )
        return problems

    def migrate_instances(
        self,
        conn: psycopg.Connection[Any],
        name: str,
        to_version: int,
        *,
        dry_run: bool = False,
        batch_size: int = 500,
        on_progress: Callable[[int], None] | None = None,
    ) -> MigrationReport:
        """Move running sagas of older versions to ``to_version`` by its migration rules.

        Each batch is a transaction; each saga moves in one row update whose guard
        reads its recorded progress, so a saga past the guard step stays where it is.
        """
        target = self.definition(name, to_version)
        if not target.migrations:
            raise ConfigurationError(
                f"saga {name!r} v{to_version} declares no migrate_from(...) rule"
            )
        store = self.orchestrator.store
        moved: dict[int, int] = {}
        stayed: dict[int, int] = {}
        for rule in target.migrations:
            with conn.transaction():
                would_move, would_stay = store.migration_plan(
                    conn, name, rule.from_version, rule.unless_passed
                )
            stayed[rule.from_version] = would_stay
            if dry_run:
                moved[rule.from_version] = would_move
                continue
            moved[rule.from_version] = 0
            while True:
                with conn.transaction():
                    batch = store.migrate_batch(
                        conn, name, rule.from_version, to_version, rule.unless_passed, batch_size
                    )
                    store.log(conn, _migrated_entries(batch, rule.from_version, to_version))
                moved[rule.from_version] += len(batch)
                if on_progress:
                    on_progress(len(batch))
                if len(batch) < batch_size:
                    break
        return MigrationReport(moved, stayed)

    def cancel(self, tx: Tx, saga_id: UUID, reason: str) -> None:
        """Ask a running saga to compensate from where it is (in the caller's transaction)."""
        self.orchestrator.cancel(tx, saga_id, reason)

    async def cancel_async(self, tx: AsyncTx, saga_id: UUID, reason: str) -> None:
        """:meth:`cancel` on an async connection."""
        await self.orchestrator.cancel_async(tx, saga_id, reason)

    # -- the consumer ----------------------------------------------------------

    def as_service(self) -> Service:
        """The orchestrator as a service: ``saga consume module:registry`` runs this."""
        if self._service is None:
            service = Service(self.service_name, retry=self.retry)
            for message_class in self._reply_types.values():
                handler = self._internal.get(message_class, self._on_reply)
                service.add_handler(message_class, handler)
            for event_class, _ in self._events.values():
                service.add_subscription(event_class, self._on_event)
            service.on_connect(self.check_versions)
            service.batch_writing = SagaBatchWriting(self.home)
            service.reply_joins = ReplyJoins(self.sagas) or None
            service.schema = self.schema
            self._service = service
        return self._service

    def _on_reply(self, tx: Tx, reply: BaseModel, ctx: HandlerContext) -> None:
        self.orchestrator.on_reply(tx, reply, ctx.envelope, ctx.metrics, _batch(ctx))

    def _on_timer(self, tx: Tx, timer: StepTimer, ctx: HandlerContext) -> None:
        self.orchestrator.on_timer(tx, timer, ctx.envelope, ctx.metrics, _batch(ctx))

    def _on_start(self, tx: Tx, request: StartSaga, ctx: HandlerContext) -> None:
        self.orchestrator.on_start(tx, request, ctx.metrics, _batch(ctx))

    def _on_resume(self, tx: Tx, request: ResumeSaga, ctx: HandlerContext) -> None:
        self.orchestrator.on_resume(tx, request, ctx.metrics, _batch(ctx))

    def _on_signal(self, tx: Tx, signal: Signal, ctx: HandlerContext) -> None:
        self.orchestrator.on_signal(tx, signal, ctx.metrics, _batch(ctx))

    def _on_event(self, tx: Tx, event: BaseModel, ctx: HandlerContext) -> None:
        waits = self._events[ctx.envelope.type][1]
        self.orchestrator.events.on_event(tx, event, ctx.envelope, waits, ctx.metrics, _batch(ctx))

    def _on_wait_timeout(self, tx: Tx, timeout: WaitTimeout, ctx: HandlerContext) -> None:
        self.orchestrator.on_wait_timeout(tx, timeout, ctx.envelope, ctx.metrics, _batch(ctx))

    def _on_deadline(self, tx: Tx, deadline: StepDeadline, ctx: HandlerContext) -> None:
        self.orchestrator.on_deadline(tx, deadline, ctx.envelope, ctx.metrics, _batch(ctx))


def _batch(ctx: HandlerContext) -> StagedSagaWrites | None:
    """The orchestrator's staged writes for the batch ``ctx`` belongs to, if any."""
    return ctx.batch if isinstance(ctx.batch, StagedSagaWrites) else None


def _migrated_entries(
    rows: list[tuple[UUID, str | None, int]], from_version: int, to_version: int
) -> list[StepLogEntry]:
    moment = datetime.now(UTC)
    note = f"moved from version {from_version} to {to_version}"
    return [
        StepLogEntry(
            saga_id, step or "(start)", Phase.FORWARD, attempt, "migrated", moment, moment, note
        )
        for saga_id, step, attempt in rows
    ]
