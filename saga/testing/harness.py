"""A saga and its participants in one process, on a real PostgreSQL, with a virtual clock.

Messages go from outbox to handler in process: the harness takes every row of
the outbox, hands each to its destination (a real service's batch processor,
with its inbox, savepoints and replies, or a stub the test answers) and
records it. A delayed row (a timer, a wait's timeout, a deadline, a retry) is
due at the virtual time it was written plus its delay; :meth:`advance` fires
what falls due, in order, and nothing ever sleeps.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from pydantic import BaseModel

from saga.consumers.delivery_batches import Delivery, DeliveryBatchProcessor, DeliveryOutcome
from saga.db.sql import Tx
from saga.effects.side_effects import SideEffects
from saga.engine.definition import Saga
from saga.engine.registry import SagaRegistry
from saga.engine.state import SagaRecord, SagaStatus
from saga.engine.store import SagaFilter
from saga.errors import StepFailed
from saga.handlers.context import HandlerContext
from saga.handlers.service import HandlerSpec, Service
from saga.messaging.envelope import Envelope, message_type_of
from saga.messaging.outbox import Outbox
from saga.testing.clock import VirtualClock
from saga.testing.database import HarnessDatabase
from saga.testing.explore import DEFAULT_BUDGET, Invariant, explore
from saga.testing.messages import (
    Expected,
    Message,
    SentMessages,
    check_message,
    check_messages,
    check_messages_in_any_order,
)
from saga.testing.stubs import Answer, Fail, PendingCommand, Stubs, as_reply

#: How far ``run_until_idle(skip_time=True)`` moves the clock at most.
DEFAULT_SKIP_LIMIT = timedelta(days=366)

_TAKE_OUTBOX = """
DELETE FROM {schema}.outbox
RETURNING id, destination, body, deliver_after - created_at AS delay
"""


@dataclass(frozen=True, slots=True)
class Consumed:
    """A message a real service handled, and what became of it."""

    service: str
    message: Message
    outcome: DeliveryOutcome


@dataclass(frozen=True, slots=True)
class Run:
    """What :meth:`SagaHarness.run_until_idle` did: messages delivered, virtual time passed."""

    delivered: int
    elapsed: timedelta


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One row of a saga's step log."""

    step: str
    phase: str
    outcome: str
    attempt: int
    started_at: datetime
    finished_at: datetime
    error: str | None


@dataclass
class _Fault:
    error: BaseException
    remaining: int


@dataclass(order=True)
class _Scheduled:
    due: datetime
    seq: int
    message: Message = field(compare=False)


class SagaHarness:
    """The sagas of ``registry`` and the real ``services``; every other destination is a stub.

    ``fail_fast``: a handler's exception (other than ``StepFailed``) is raised in the
    test as soon as its delivery is scheduled for a retry or dead-lettered, instead of
    going the retry way silently. Pass False to test retries and dead letters.
    """

    def __init__(
        self,
        database: HarnessDatabase,
        registry: SagaRegistry | None = None,
        *,
        services: Iterable[Service] = (),
        schema: Iterable[str | Path] = (),
        fail_fast: bool = True,
        clock: VirtualClock | None = None,
    ) -> None:
        self.database = database
        self.registry = registry
        self.clock = clock or VirtualClock()
        self.fail_fast = fail_fast
        #: every message sent, in order; ``sent(service, Type, where=...)`` finds matches
        self.sent = SentMessages()
        #: the events published, once each (their subscribers' copies are in ``sent``)
        self.published: list[Message] = []
        self.consumed: list[Consumed] = []
        self.stubs = Stubs()
        self._scheduled: list[_Scheduled] = []
        self._seq = itertools.count()
        self._faults: dict[tuple[str, str], _Fault] = {}
        self._errors: list[tuple[str, str, BaseException]] = []
        self._delivered: Counter[tuple[str, str]] = Counter()
        self._crashes: dict[tuple[str, str], set[int]] = {}
        self._holds: dict[tuple[str, str], set[int]] = {}
        self._held: list[tuple[Message, bool]] = []
        # called with each message bound for a service and its number among those of its
        # service and type, before anything is done with it (how explore steers a run)
        self._on_delivery: Callable[[Message, int], None] | None = None
        self._outbox = Outbox(database.schema)
        self._take = _TAKE_OUTBOX.format(schema=database.schema)
        database.apply(schema)
        self.conn = psycopg.connect(database.url, autocommit=True)
        # a test database need not outlive a server crash: commits need not wait for the disk
        self.conn.execute("SET synchronous_commit = off")
        database.reset(self.conn)
        self._effects = SideEffects(database.url, schema=database.schema)
        originals = list(services)
        self._given_services = list(originals)
        self._restore_clock: Callable[[], datetime] | None = None
        if registry is not None:
            self._restore_clock = registry.orchestrator.clock
            registry.orchestrator.clock = self.clock.now
            originals.insert(0, registry.as_service())
        self.services = {s.name: self._instrumented(s) for s in originals}
        self._processors = {
            name: DeliveryBatchProcessor(service, schema=database.schema, effects=self._effects)
            for name, service in self.services.items()
        }
        for service in self.services.values():
            for hook in service.connect_hooks:
                with self.conn.transaction():
                    hook(self.conn)

    def close(self) -> None:
        if self.registry is not None and self._restore_clock is not None:
            self.registry.orchestrator.clock = self._restore_clock
        self._effects.close()
        self.conn.close()

    def __enter__(self) -> SagaHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- driving ---------------------------------------------------------------

    def start(
        self, saga: Saga[Any] | str, data: BaseModel, *, idempotency_key: str | None = None
    ) -> UUID:
        """Start a saga as the application would, in a transaction of its own."""
        registry = self._registry()
        with self.conn.transaction():
            return registry.start(self.conn, saga, data, idempotency_key=idempotency_key)

    def signal(self, saga_id: UUID, event: str, data: BaseModel | dict[str, Any]) -> None:
        with self.conn.transaction():
            self._registry().signal(self.conn, saga_id, event, data)

    def cancel(self, saga_id: UUID, reason: str = "cancelled by the test") -> None:
        with self.conn.transaction():
            self._registry().cancel(self.conn, saga_id, reason)

    def run_until_idle(
        self,
        max_messages: int = 10_000,
        *,
        skip_time: bool = False,
        limit: timedelta = DEFAULT_SKIP_LIMIT,
    ) -> Run:
        """Deliver every message that is due now, and what they send, until none is left.

        ``skip_time``: then, whenever nothing else can happen, move the clock to the next
        timer (a wait's timeout, a deadline, a delayed retry or message) and fire it, until
        every saga has settled (no saga running or compensating), nothing is scheduled,
        a stubbed service holds a command for the test to answer, or the next timer lies
        more than ``limit`` after the start. The result says how much virtual time passed.
        """
        start = self.clock.now()
        delivered = self._drain(max_messages)
        while skip_time and self._may_skip(start + limit):
            item = heapq.heappop(self._scheduled)
            self.clock.move_to(item.due)
            self._deliver(item.message)
            delivered += 1 + self._drain(max_messages - delivered)
        return Run(delivered, self.clock.now() - start)

    def advance(self, delta: timedelta) -> int:
        """Move the clock by ``delta``, firing what falls due on the way, earliest first."""
        target = self.clock.now() + delta
        delivered = self._drain()
        while self._scheduled and self._scheduled[0].due <= target:
            item = heapq.heappop(self._scheduled)
            self.clock.move_to(item.due)
            self._deliver(item.message)
            delivered += 1 + self._drain()
        self.clock.move_to(target)
        return delivered

    @property
    def scheduled(self) -> list[tuple[datetime, Message]]:
        """The delayed messages not yet due, earliest first."""
        return [(item.due, item.message) for item in sorted(self._scheduled)]

    # -- stubbed participants ----------------------------------------------------

    def on(self, service: str, command: type[BaseModel], answer: Answer) -> None:
        """Answer every ``command`` sent to the stubbed ``service`` with ``answer``."""
        self.stubs.add_rule(service, message_type_of(command), answer)

    def expect_command(self, service: str, expected: Expected | None = None) -> PendingCommand:
        """Run until idle; the oldest unanswered command at ``service``, checked against
        ``expected`` (a whole message, or a type); answer it with ``.reply``/``.fail``."""
        if service in self._processors:
            raise AssertionError(
                f"{service!r} runs for real in this harness (one of its services), so its "
                "commands go to its handlers and none waits for the test's answer: check what "
                f"it handled with assert_consumed({service!r}, ...) or consumed_by({service!r}), "
                "or leave it out of services= to stub it"
            )
        self.run_until_idle()
        message = self.stubs.take(service, expected)
        if expected is not None:
            check_message(expected, message, f"command sent to {service}")
        return PendingCommand(self, message)

    def answer(self, command: Message, answer: BaseModel | Fail) -> None:
        """Send what the stubbed participant answers to ``command`` (delivered by the next run)."""
        ctx = HandlerContext(command.envelope, command.service)
        if ctx.reply(as_reply(answer, command)) is None:
            raise AssertionError(f"{command!r} expects no reply")
        with self.conn.transaction():
            self._outbox.add_many(self.conn, ctx.outgoing)

    # -- faults ----------------------------------------------------------------------

    def fail_transiently(
        self,
        service: str,
        message_type: type[BaseModel],
        times: int,
        error: BaseException | None = None,
    ) -> None:
        """The real ``service``'s handler of ``message_type`` raises ``error`` (a
        ``ConnectionError`` by default) on its next ``times`` calls, then runs again."""
        fault = error or ConnectionError("transient fault injected by the test")
        self._inject((service, message_type_of(message_type)), fault, times)

    def _inject(self, key: tuple[str, str], error: BaseException, times: int) -> None:
        self._faults[key] = _Fault(error, times)

    def redeliver(self, message: Message) -> None:
        """Deliver ``message`` again, as a broker does after a crash between commit and ack."""
        self._deliver(message)

    def crash_after_commit(
        self, service: str, message_type: type[BaseModel], times: int = 1, *, nth: int | None = None
    ) -> None:
        """The real ``service``'s next ``times`` deliveries of ``message_type`` (or its
        ``nth`` one, counted from the test's start) are handled and committed, then its
        consumer dies before the acknowledgement: the broker hands each one over again at
        once (the inbox must make that a no-op, its reply sent again)."""
        self._plan(self._crashes, (service, message_type_of(message_type)), times, nth)

    def hold(self, service: str, message_type: type[BaseModel], *, nth: int | None = None) -> None:
        """Hold back the next ``message_type`` bound for ``service`` (or its ``nth`` one,
        counted from the test's start), as a slow broker queue would, until
        :meth:`release`: what is sent after it overtakes it."""
        self._plan(self._holds, (service, message_type_of(message_type)), 1, nth)

    def _plan(
        self,
        plans: dict[tuple[str, str], set[int]],
        key: tuple[str, str],
        times: int,
        nth: int | None,
    ) -> None:
        planned = plans.setdefault(key, set())
        first = nth if nth is not None else max([self._delivered[key], *planned]) + 1
        planned.update(range(first, first + times))

    def release(self, service: str, message_type: type[BaseModel] | None = None) -> int:
        """Hand over the held messages for ``service`` (of ``message_type``), oldest first,
        then run until idle; returns how many were held."""
        return self._release(service, message_type_of(message_type) if message_type else None)

    def _release(self, service: str, wanted: str | None) -> int:
        held = [
            h for h in self._held if h[0].destination == service and wanted in (None, h[0].type)
        ]
        if not held:
            raise AssertionError(f"nothing held for {service!r} ({wanted or 'any type'})")
        for item in held:
            self._held.remove(item)
            self._hand_over(*item)
        self.run_until_idle()
        return len(held)

    # -- exploring -----------------------------------------------------------------

    def explore(
        self,
        saga: Saga[Any],
        data: BaseModel,
        invariant: Invariant,
        *,
        setup: Callable[[SagaHarness], object] | None = None,
        max_examples: int = DEFAULT_BUDGET,
    ) -> None:
        """Run ``saga`` on ``data`` under up to ``max_examples`` schedules of failures drawn
        by Hypothesis (every step failing or dead-lettered, every message delivered twice
        or late, a cancel while any message is on its way), each in a fresh harness made as
        this one (its stubs' rules included) and seeded by ``setup``; after each settles,
        ``invariant(h, saga_id)`` must neither raise nor return False. A failure is shrunk to
        the shortest schedule and carries the harness test that replays it. The database is
        left as the last run left it."""
        explore(self._sibling, saga, data, invariant, setup=setup, max_examples=max_examples)

    def _sibling(self) -> SagaHarness:
        sibling = SagaHarness(
            self.database, self.registry, services=self._given_services, fail_fast=False
        )
        sibling.stubs = self.stubs.copy()
        return sibling

    # -- what happened -------------------------------------------------------------

    def sent_to(self, service: str) -> list[Message]:
        return [m for m in self.sent if m.destination == service]

    def consumed_by(self, service: str) -> list[Message]:
        """The messages ``service`` (a real one) handled, duplicates and refusals left out."""
        handled = (DeliveryOutcome.HANDLED, DeliveryOutcome.BUSINESS_FAILURE)
        return [c.message for c in self.consumed if c.service == service and c.outcome in handled]

    def assert_sent(self, service: str, *expected: Expected, any_order: bool = False) -> None:
        """Everything sent to ``service`` so far is ``expected``: in order, or in any order
        with ``any_order=True``."""
        check = check_messages_in_any_order if any_order else check_messages
        check(expected, self.sent_to(service), f"messages sent to {service}")

    def assert_published(self, *expected: Expected) -> None:
        """Every event published so far, in order, is ``expected``."""
        check_messages(expected, self.published, "events published")

    def assert_consumed(self, service: str, *expected: Expected) -> None:
        """Everything ``service`` handled so far, in order, is ``expected``."""
        check_messages(expected, self.consumed_by(service), f"messages {service} consumed")

    def record(self, saga_id: UUID) -> SagaRecord:
        record = self._registry().orchestrator.store.load(self.conn, saga_id)
        if record is None:
            raise AssertionError(f"no saga {saga_id}")
        return record

    def status(self, saga_id: UUID) -> str:
        return self.record(saga_id).status.value

    def step(self, saga_id: UUID) -> str | None:
        return self.record(saga_id).step

    def data(self, saga_id: UUID) -> BaseModel:
        """The saga's data as its definition's model."""
        record = self.record(saga_id)
        definition = self._registry().definition(record.name, record.saga_version)
        data: BaseModel = definition.data_model.model_validate(record.data)
        return data

    def timeline(self, saga_id: UUID) -> list[TimelineEntry]:
        rows = self._registry().orchestrator.store.timeline(self.conn, saga_id)
        return [TimelineEntry(r[0], r[1], r[3], r[2], r[4], r[5], r[6]) for r in rows]

    def steps(self, saga_id: UUID) -> list[str]:
        """The step log in short: ``"reserve_credit succeeded"``, ``"reserve_credit
        compensation succeeded"``, one per entry."""
        return [
            f"{e.step} {e.outcome}" if e.phase == "forward" else f"{e.step} {e.phase} {e.outcome}"
            for e in self.timeline(saga_id)
        ]

    def rows(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of a query on the test database (business tables, the framework's)."""
        return self.conn.execute(query.encode(), params).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A transaction on the test database, to seed or change business rows."""
        with self.conn.transaction():
            yield self.conn

    # -- in process ------------------------------------------------------------------

    def _registry(self) -> SagaRegistry:
        if self.registry is None:
            raise AssertionError("this harness was made without a saga registry")
        return self.registry

    def _drain(self, max_messages: int = 10_000) -> int:
        """Deliver what is due now, and what that sends, until the outbox stays empty."""
        delivered = 0
        while ready := self._collect():
            for message in ready:
                self._deliver(message)
            delivered += len(ready)
            if delivered > max_messages:
                raise AssertionError(f"still busy after {delivered} messages: a loop?")
        return delivered

    def _may_skip(self, horizon: datetime) -> bool:
        """Whether time may jump to the next timer: one is scheduled before ``horizon``, no
        command waits for the test's answer, and some saga is still on its way."""
        if not self._scheduled or self._scheduled[0].due > horizon:
            return False
        if any(self.stubs.waiting.values()):
            return False
        return self.registry is None or self._unsettled()

    def _unsettled(self) -> bool:
        store = self._registry().orchestrator.store
        return any(
            store.list(self.conn, SagaFilter(status=status, limit=1))
            for status in (SagaStatus.RUNNING, SagaStatus.COMPENSATING)
        )

    def _collect(self) -> list[Message]:
        """Empty the outbox: rows due now, in id order; delayed ones go on the schedule."""
        with self.conn.transaction():
            rows = sorted(self.conn.execute(self._take.encode()).fetchall())
        ready = []
        for _, destination, body, delay in rows:
            message = Message(destination, Envelope.from_bytes(bytes(body)), bytes(body))
            if delay is None:
                ready.append(message)
            else:
                due = self.clock.now() + delay
                heapq.heappush(self._scheduled, _Scheduled(due, next(self._seq), message))
        return ready

    def _deliver(self, message: Message) -> None:
        if message.destination is None:  # an event: a copy for each subscribing service
            self.published.append(message)
            for name, service in self.services.items():
                if message.type in service.subscriptions:
                    self._deliver(replace(message, destination=name))
            return
        self.sent.append(message)
        key = (message.service, message.type)
        self._delivered[key] += 1
        nth = self._delivered[key]
        if self._on_delivery is not None:
            self._on_delivery(message, nth)
        crash = nth in self._crashes.get(key, set())
        if nth in self._holds.get(key, set()):
            self._held.append((message, crash))
            return
        self._hand_over(message, crash)

    @property
    def held(self) -> list[Message]:
        """The messages held back (:meth:`hold`), oldest first."""
        return [message for message, _ in self._held]

    def _hand_over(self, message: Message, crash: bool = False) -> None:
        processor = self._processors.get(message.service)
        if processor is None:
            answer = self.stubs.receive(message)
            if answer is not None:
                self.answer(message, answer)
            return
        self._errors.clear()
        (outcome,) = processor.process(self.conn, [Delivery(message.body, "application/json")])
        self.consumed.append(Consumed(message.service, message, outcome))
        if crash and outcome is not DeliveryOutcome.RETRY_SCHEDULED:
            self._hand_over(message)  # committed, never acknowledged: the broker redelivers
            return
        failed = outcome in (DeliveryOutcome.RETRY_SCHEDULED, DeliveryOutcome.DEAD_LETTERED)
        if failed and self.fail_fast and self._errors:
            service, type_name, error = self._errors[-1]
            error.add_note(
                f"raised by {service}'s handler of {type_name}; the harness fails fast "
                "(SagaHarness(..., fail_fast=False) lets it retry and dead-letter instead)"
            )
            raise error

    def _instrumented(self, service: Service) -> Service:
        """A copy of ``service`` whose handlers run the test's faults, report their errors,
        and retry in process without waiting (delayed retries follow the virtual clock)."""
        copy = Service(service.name, retry=service.retry)
        for type_name in service.message_types:
            spec = service.handler_for(type_name)
            assert spec is not None
            retry = replace(spec.retry, immediate_initial_wait=0.0, immediate_max_wait=0.0)
            watched = self._watched(service.name, spec)
            if type_name in service.subscriptions:
                copy.add_subscription(spec.message_class, watched, retry=retry)
            else:
                copy.add_handler(spec.message_class, watched, retry=retry)
        copy.batch_writing = service.batch_writing
        copy.connect_hooks = list(service.connect_hooks)
        return copy

    def _watched(self, service: str, spec: HandlerSpec) -> Any:
        def handler(tx: Tx, message: Any, ctx: HandlerContext) -> Any:
            fault = self._faults.get((service, ctx.envelope.type))
            if fault is not None and fault.remaining > 0:
                fault.remaining -= 1
                raise fault.error
            try:
                return spec.func(tx, message, ctx)
            except StepFailed:
                raise
            except Exception as exc:
                self._errors.append((service, ctx.envelope.type, exc))
                raise

        handler.__qualname__ = spec.name
        return handler
