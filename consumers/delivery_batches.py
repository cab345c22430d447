"""Handling a batch of deliveries in ONE database transaction.

First the inbox rows ``(consumer, message_id)`` of the whole batch, in one
statement that also takes the forward commands' step-key locks and finds which of
their steps are closed: a message whose row was already there was processed before
and is skipped. Then the handlers run on the open transaction, in segments of up to
:data:`SEGMENT` deliveries that share one savepoint: while no handler fails, that
is one savepoint command per segment instead of one per delivery (where an
OpenTelemetry SDK records spans, every delivery has a savepoint of its own, so
that no handler runs twice and each message has exactly one span). A handler that
raises rolls its segment back; the deliveries before it in the segment run again,
each in a savepoint of its own, the failed one goes down its failure path (its
first try already failed: it is not run again for that), and the batch goes on.
A message that ends up retried later or dead-lettered gets its inbox row removed
again. The replies sent for the batch's handled messages are kept with their inbox
rows; a duplicate is answered again with the replies kept for it (one statement,
when there are duplicates), so a saga whose reply a broker lost gets it when the saga
is resumed. The batch's outbox rows, its kept replies and more go in one closing
statement (:mod:`saga.consumers.closing`). The caller commits once for the whole
batch, then acknowledges.

A delivery alone in its transaction (the usual case below full load) runs with no
savepoint, and so do deliveries that all concern one saga (a parallel group's replies
handled together): if a handler raises, the transaction rolls back and a new one runs
the deliveries before it again with care and the failed one's failure path
(:class:`~saga.errors.LoneDeliveryFailed`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Any
from uuid import UUID

import psycopg
from pydantic import BaseModel

from saga.broker.transport import DEFAULT_DELIVERY_LIMIT, delivery_count
from saga.consumers.closing import Closing
from saga.consumers.decoding import Decoded, decode
from saga.consumers.failures import FailurePaths
from saga.consumers.inbox import Inbox
from saga.db.sql import Tx
from saga.effects.side_effects import SideEffects
from saga.errors import (
    BatchConflict,
    ConcurrentUpdate,
    ConfigurationError,
    LoneDeliveryFailed,
    NeedsSavepoint,
    Rejection,
    SignatureRejected,
    StepFailed,
)
from saga.faults import fault_point
from saga.handlers.batching import StagedWrites
from saga.handlers.closed_steps import ClosedSteps
from saga.handlers.context import HandlerContext
from saga.handlers.service import Service
from saga.messaging.control import Ack
from saga.messaging.dead_letters import DeadLetterStore
from saga.messaging.envelope import COMMITTED_AT_HEADER, STEP_HEADER, Envelope
from saga.messaging.leases import Leases, Settled, active_leases
from saga.messaging.outbox import NewOutboxRow, Outbox, OutgoingMessage
from saga.messaging.signing import KeyRing
from saga.observability import tracing
from saga.observability.logs import log_context
from saga.observability.metrics import Metrics

logger = logging.getLogger(__name__)

#: Deliveries that share one savepoint while none of their handlers fails.
SEGMENT = 16

#: Errors that mean "another transaction holds what this one needs": retried in a short
#: transaction of their own rather than inside a batch that holds other locks.
LOCK_CONFLICTS = (
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
    psycopg.errors.LockNotAvailable,
)


class DeliveryOutcome(StrEnum):
    """What became of one delivery."""

    HANDLED = "handled"
    DUPLICATE = "duplicate"
    BUSINESS_FAILURE = "business_failure"
    RETRY_SCHEDULED = "retry_scheduled"
    DEAD_LETTERED = "dead_lettered"
    REJECTED = "rejected"
    STALE = "stale"  # a command for a step already compensated here: not executed


@dataclass(frozen=True, slots=True)
class Delivery:
    """The raw bytes of one message as the broker handed them over."""

    body: bytes
    content_type: str | None
    headers: Mapping[str, Any] | None = None
    #: Why the broker's client could not read the body, if it could not (the body is then
    #: as it arrived, e.g. not decompressed).
    unreadable: str | None = None


@dataclass(frozen=True, slots=True)
class _Opened:
    """What a transaction's opening statement found: the ids not processed before, the
    closed step keys, the documents the service read, what of earlier publishing it
    settled."""

    fresh: set[UUID] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)
    read: list[Any] = field(default_factory=list)
    settled: Settled = field(default_factory=Settled)


@dataclass(slots=True)
class _Staged:
    """What a batch keeps in memory until it commits (a segment that rolls back drops its part)."""

    #: outbox rows the batch's handlers sent, written in one statement before it commits
    rows: list[NewOutboxRow] = field(default_factory=list)
    #: (handled message id, reply) of the batch, kept with the inbox before it commits
    replies: list[tuple[UUID, OutgoingMessage]] = field(default_factory=list)
    #: when each handled message's outbox row committed (for the latency metric)
    created: list[float] = field(default_factory=list)
    #: (outcome, seconds) of each delivery, counted in the metrics once the batch commits
    handled: list[tuple[DeliveryOutcome, float]] = field(default_factory=list)
    #: step keys closed here: their forward commands are refused
    closed: set[str] = field(default_factory=set)
    #: message ids of the batch's new deliveries not yet handled
    fresh: set[UUID] = field(default_factory=set)

    def mark(self) -> tuple[int, int, int, int, frozenset[str], frozenset[UUID]]:
        return (
            len(self.rows),
            len(self.replies),
            len(self.created),
            len(self.handled),
            frozenset(self.closed),
            frozenset(self.fresh),
        )

    def restore(self, mark: tuple[int, int, int, int, frozenset[str], frozenset[UUID]]) -> None:
        rows, replies, created, handled, closed, fresh = mark
        del self.rows[rows:], self.replies[replies:], self.created[created:]
        del self.handled[handled:]
        self.closed, self.fresh = set(closed), set(fresh)


class DeliveryBatchProcessor:
    """Applies deliveries for one service on a connection the caller owns."""

    def __init__(
        self,
        service: Service,
        *,
        schema: str = "saga",
        outbox: Outbox | None = None,
        max_message_bytes: int | None = None,
        metrics: Metrics | None = None,
        signing: KeyRing | None = None,
        batch_lock_timeout_ms: int = 250,
        effects: SideEffects | None = None,
        delivery_limit: int = DEFAULT_DELIVERY_LIMIT,
    ) -> None:
        self.service = service
        #: earlier deliveries that came back unsettled after which a message is dead-lettered
        self.delivery_limit = delivery_limit
        self.metrics = metrics
        self.signing = signing
        self.effects = effects
        self._staged = _Staged()
        #: the service's staged writes for this batch, when it writes batches at once
        self._scope: StagedWrites | None = None
        self._in_batch = False
        self.batch_lock_timeout_ms = batch_lock_timeout_ms
        self.outbox = outbox or Outbox(schema)
        self.inbox = Inbox(schema)
        self.closed_steps = ClosedSteps(schema)
        self.closing = Closing(schema, self.outbox, self.inbox)
        self.dead_letters = DeadLetterStore(schema)
        self.failures = FailurePaths(
            service.name, self.outbox, self.inbox, self.dead_letters, self._keep
        )
        self.max_message_bytes = max_message_bytes or self.outbox.max_message_bytes

    def process(self, tx: Tx, deliveries: Sequence[Delivery]) -> list[DeliveryOutcome]:
        """Handle ``deliveries`` and commit them together; return one outcome each.

        Raises :class:`BatchConflict` when a handler hits a lock conflict in a batch of
        several: the caller then handles the deliveries one per transaction.

        A delivery alone in its transaction runs with no savepoint, and so do deliveries
        that all concern one saga (the replies of a parallel group, a fan-out's items),
        with no lock timeout: should a handler fail, the whole transaction rolls back, and
        a new one runs the deliveries before it again with care, takes its failure path
        (the handler is not run again for that, as in a batch) and handles the rest.
        """
        checked = [self._check(delivery) for delivery in deliveries]
        if _unguarded(checked) and not tracing.records_spans():
            try:
                return self._transaction(tx, deliveries, checked, alone=True)
            except LoneDeliveryFailed as failed:
                return self._transaction(tx, deliveries, checked, failed=failed)
        return self._transaction(tx, deliveries, checked)

    def _transaction(
        self,
        conn: psycopg.Connection[Any],
        deliveries: Sequence[Delivery],
        checked: list[Decoded | Rejection],
        *,
        alone: bool = False,
        failed: LoneDeliveryFailed | None = None,
    ) -> list[DeliveryOutcome]:
        """One transaction for ``deliveries``: ``alone`` (no savepoint, a failure rolls it
        all back), or after the failure of one of those (``failed``), or a batch."""
        staged = self._staged = _Staged()
        self._scope = None
        self._in_batch = len(deliveries) > 1
        leases = active_leases()
        if leases is not None:
            # what a transaction rolled back before this one leased; a failure in one with
            # no savepoint rolls it all back (LoneDeliveryFailed)
            leases.forget_written(alone and failed is None and not tracing.records_spans())
        with ExitStack() as transaction:
            opened = self._begin(conn, transaction, checked, leases, lock_timeout=not alone)
            staged.fresh, staged.closed = opened.fresh, opened.closed
            self._answer_duplicates(conn, checked, staged.fresh)
            self._scope = self._open_scope(checked, staged.fresh, opened.read)
            items = list(zip(deliveries, checked, strict=True))
            writing = self.service.batch_writing
            offered = (
                writing.alone(opened.read)
                if writing is not None and self._scope is None
                else nullcontext()
            )
            with offered:
                if failed is not None:
                    outcomes = self._after_failure(conn, items, failed)
                else:
                    outcomes = self._handle_all(conn, items, alone)
            if self._scope is not None:
                standing = nullcontext() if leases is None else leases.standing_writes()
                with self._conflicts_end_the_batch(), standing:  # the top level: no savepoint
                    self._scope.flush(conn)
            settled = self.closing.close(
                conn, self.service.name, staged.rows, staged.replies, leases, opened.settled
            )
            fault_point("consumer.before_commit")
        fault_point("consumer.after_commit")
        if leases is not None:
            settled.forget(leases)
        self._count(len(deliveries))
        return outcomes

    def dead_letter_poison(self, tx: Tx, delivery: Delivery, error: BaseException) -> None:
        """Record a delivery whose transaction itself keeps failing, in a transaction of its own."""
        self.failures.dead_letter_poison(tx, delivery.body, delivery.content_type, error)

    # -- segments ------------------------------------------------------------

    def _handle_all(
        self,
        tx: Tx,
        items: list[tuple[Delivery, Decoded | Rejection]],
        alone: bool,
    ) -> list[DeliveryOutcome]:
        # Where spans are recorded, a delivery is never run twice: each message keeps
        # exactly one span.
        if tracing.records_spans():
            return [self._careful(tx, delivery, item) for delivery, item in items]
        outcomes: list[DeliveryOutcome] = []
        if alone:
            for index, (delivery, item) in enumerate(items):
                outcome = self._handle(tx, delivery, item, careful=False)
                if not isinstance(outcome, DeliveryOutcome):
                    raise LoneDeliveryFailed(outcome, index)
                outcomes.append(outcome)
            return outcomes
        while len(outcomes) < len(items):
            start = len(outcomes)
            outcomes += self._segment(tx, items[start : start + SEGMENT])
        return outcomes

    def _after_failure(
        self,
        tx: Tx,
        items: list[tuple[Delivery, Decoded | Rejection]],
        failed: LoneDeliveryFailed,
    ) -> list[DeliveryOutcome]:
        """The deliveries of a transaction with no savepoint that ``failed``, in a new one:
        those before the failed one with care, the failed one down its failure path with
        its first try's error, the rest in segments."""
        outcomes = self._recover(tx, items[: failed.index], items[failed.index], failed.error)
        rest = items[failed.index + 1 :]
        return outcomes + (self._handle_all(tx, rest, alone=False) if rest else [])

    def _recover(
        self,
        tx: Tx,
        before: list[tuple[Delivery, Decoded | Rejection]],
        failed: tuple[Delivery, Decoded | Rejection],
        error: Exception,
    ) -> list[DeliveryOutcome]:
        """After the rollback of deliveries handled with no savepoint of their own: those
        ``before`` the one that ``failed`` again, with care, then that one's failure path."""
        again = [self._careful(tx, d, item) for d, item in before]
        # A handler that needed a savepoint to go on runs again with one; any other
        # failure would have been the same with one: its first try is done.
        first_try = None if isinstance(error, NeedsSavepoint) else error
        return [*again, self._careful(tx, *failed, first_try=first_try)]

    def _segment(
        self, tx: Tx, items: list[tuple[Delivery, Decoded | Rejection]]
    ) -> list[DeliveryOutcome]:
        """Handle ``items`` under one savepoint, up to and including the first that fails.

        When a handler raises, the segment rolls back to its savepoint; the deliveries
        before it are handled again with a savepoint each, and the one that failed takes
        its failure path with the error its first try raised.
        """
        scope = self._scope
        mark, scope_mark = self._staged.mark(), scope.mark() if scope is not None else None
        tx.execute("SAVEPOINT segment", prepare=False)
        outcomes: list[DeliveryOutcome] = []
        for delivery, item in items:
            outcome = self._handle(tx, delivery, item, careful=False)
            if isinstance(outcome, DeliveryOutcome):
                outcomes.append(outcome)
                continue
            tx.execute("ROLLBACK TO SAVEPOINT segment", prepare=False)
            self._staged.restore(mark)
            if scope is not None:
                scope.restore(scope_mark)
            return self._recover(tx, items[: len(outcomes)], (delivery, item), outcome)
        return outcomes

    # -- one delivery --------------------------------------------------------

    def _check(self, delivery: Delivery) -> Decoded | Rejection:
        """Signature and decoding, before the transaction: the message, or why it is refused."""
        signing = self.signing
        check = None if signing is None else partial(signing.verify, headers=delivery.headers)
        try:
            body, content_type = delivery.body, delivery.content_type
            return decode(
                body, content_type, self.service, self.max_message_bytes, check,
                unreadable=delivery.unreadable,
            )  # fmt: skip
        except SignatureRejected as bad:
            return Rejection(bad.error_type, bad.message)
        except Rejection as rejection:
            return rejection

    def _begin(
        self,
        conn: psycopg.Connection[Any],
        transaction: ExitStack,
        checked: list[Decoded | Rejection],
        leases: Leases | None,
        *,
        lock_timeout: bool,
    ) -> _Opened:
        """Begin the transaction (entered on ``transaction``) with its opening statement
        (and a batch's lock timeout between them when ``lock_timeout``), pipelined on an
        autocommit connection (the worker's): BEGIN costs no round trip of its own. A
        connection that is not autocommit sends its own BEGIN first, and then a savepoint
        stands for the transaction when the caller's is in progress."""
        pipelined = conn.pipeline() if conn.autocommit else nullcontext()
        # the same message in another open batch, or a compensation of the same step in flight
        with self._conflicts_end_the_batch(), pipelined:
            # not conn.transaction(): begun in a pipeline, it keeps one open to its end
            transaction.enter_context(psycopg.Transaction(conn))
            if self._in_batch and lock_timeout and self.batch_lock_timeout_ms:
                # A batch holds many rows' locks: give up waiting early, then go one by one.
                conn.execute(f"SET LOCAL lock_timeout = {int(self.batch_lock_timeout_ms)}")
            opening = self._open(conn, checked, leases)
        return opening()

    def _open(
        self, tx: Tx, checked: list[Decoded | Rejection], leases: Leases | None
    ) -> Callable[[], _Opened]:
        """Send the opening statement: inbox rows for every decoded delivery, and the
        step-key locks of the forward commands. The same statement settles what ``leases``
        published after earlier commits, and reads what the service's batch writing names
        (:meth:`BatchWriting.reading`). Returns what reads its result once the pipeline it
        was sent in has synced: the ids not processed before, the closed step keys, the
        documents read."""
        envelopes = [item.envelope for item in checked if isinstance(item, Decoded)]
        if not envelopes:
            return _Opened
        ids = [envelope.message_id for envelope in envelopes]
        keys = [envelope.step_key for envelope in envelopes]
        published = [] if leases is None else list(leases.published)
        unrouted = [] if leases is None else list(leases.unrouted)
        settling = self.closing.relay_store.settling(published, unrouted)
        writing = self.service.batch_writing
        reading = None if writing is None else writing.reading(envelopes)
        statement, params = self.inbox.opening(self.service.name, ids, keys, settling, reading)
        cursor = tx.execute(statement, params, prepare=True)
        settled = Settled(len(published), len(unrouted))

        def opened() -> _Opened:
            fresh, closed, read = self.inbox.opened(cursor)
            return _Opened(fresh, closed, read, settled)

        return opened

    def _answer_duplicates(
        self, tx: Tx, checked: list[Decoded | Rejection], fresh: set[UUID]
    ) -> None:
        """Send again what this consumer replied to the messages it had handled before."""
        again = [
            item.envelope.message_id
            for item in checked
            if isinstance(item, Decoded) and item.envelope.message_id not in fresh
        ]
        if not again:
            return
        leases = active_leases()
        written = self.inbox.answer_again(tx, self.service.name, again, leases)
        if leases is None:
            self.outbox.written(tx, written)
        if written:
            logger.info(
                "%s answered %d duplicate(s) again with %d kept reply(ies)",
                self.service.name,
                len(again),
                len(written),
                extra={"consumer": self.service.name},
            )

    def _open_scope(
        self, checked: list[Decoded | Rejection], fresh: set[UUID], read: list[Any]
    ) -> StagedWrites | None:
        """The service's batch scope, for a batch of several new deliveries (else None),
        given what the opening statement ``read`` for it."""
        writing = self.service.batch_writing
        if writing is None:
            return None
        new = sum(
            1 for item in checked if isinstance(item, Decoded) and item.envelope.message_id in fresh
        )
        return writing.open(read) if new >= 2 else None

    def _careful(
        self,
        tx: Tx,
        delivery: Delivery,
        item: Decoded | Rejection,
        first_try: Exception | None = None,
    ) -> DeliveryOutcome:
        outcome = self._handle(tx, delivery, item, careful=True, first_try=first_try)
        assert isinstance(outcome, DeliveryOutcome)  # careful handling settles every failure
        return outcome

    def _handle(
        self,
        tx: Tx,
        delivery: Delivery,
        item: Decoded | Rejection,
        *,
        careful: bool,
        first_try: Exception | None = None,
    ) -> DeliveryOutcome | Exception:
        """The delivery's outcome; without care, the error of a handler that raised."""
        started = time.perf_counter()
        staged = self._staged
        outcome: DeliveryOutcome | Exception
        if isinstance(item, Rejection):
            self.failures.reject(tx, delivery.body, delivery.content_type, item)
            outcome = DeliveryOutcome.REJECTED
        elif item.envelope.message_id not in staged.fresh:
            outcome = DeliveryOutcome.DUPLICATE
        elif (deliveries := delivery_count(delivery.headers)) >= self.delivery_limit:
            staged.fresh.discard(item.envelope.message_id)
            self.failures.delivery_limit_reached(tx, delivery.body, item, deliveries)
            outcome = DeliveryOutcome.DEAD_LETTERED
        elif item.envelope.step_key in staged.closed:
            staged.fresh.discard(item.envelope.message_id)
            self.failures.refuse_closed(tx, item)
            outcome = DeliveryOutcome.STALE
        else:
            staged.fresh.discard(item.envelope.message_id)  # a second copy is a duplicate
            envelope = item.envelope
            staged.created.append(_sent_at(delivery, envelope.created_at.timestamp()))
            with (
                log_context(
                    consumer=self.service.name,
                    message_id=envelope.message_id,
                    saga_id=envelope.saga_id,
                    step=envelope.headers.get(STEP_HEADER),
                ),
                tracing.span(
                    f"{self.service.name} handle {envelope.type}",
                    headers=envelope.headers,
                    attributes=_span_attributes(envelope, self.service.name),
                ),
            ):
                outcome = self._run(tx, delivery, item, careful, first_try)
        if isinstance(outcome, DeliveryOutcome):
            staged.handled.append((outcome, time.perf_counter() - started))
        return outcome

    def _run(
        self,
        tx: Tx,
        delivery: Delivery,
        decoded: Decoded,
        careful: bool,
        first_try: Exception | None,
    ) -> DeliveryOutcome | Exception:
        try:  # the common case: one try, no retry controller built
            if first_try is not None:
                raise first_try
            return self._conflict_aware(tx, decoded, careful)
        except BatchConflict:
            raise
        except Exception as exc:
            if not careful:
                return exc  # the segment rolls back; this delivery is then handled with care
            if isinstance(exc, StepFailed):
                self.failures.business_failure(tx, decoded, exc)
                return DeliveryOutcome.BUSINESS_FAILURE
            policy = decoded.spec.retry
            if not policy.is_retriable(exc) or policy.immediate_attempts == 1:
                return self._technical_failure(tx, delivery, decoded, exc, 1)
        return self._retry(tx, delivery, decoded)

    def _retry(self, tx: Tx, delivery: Delivery, decoded: Decoded) -> DeliveryOutcome:
        """The first try failed: the policy's other immediate tries (tenacity), then the rest."""
        retrying = decoded.spec.retry.retries()
        try:
            for attempt in retrying:
                with attempt:
                    outcome = self._conflict_aware(tx, decoded, careful=True)
            return outcome
        except BatchConflict:
            raise
        except StepFailed as failure:
            self.failures.business_failure(tx, decoded, failure)
            return DeliveryOutcome.BUSINESS_FAILURE
        except Exception as exc:
            tries = 1 + int(retrying.statistics.get("attempt_number", 1))
            return self._technical_failure(tx, delivery, decoded, exc, tries)
        finally:
            if self.metrics is not None:
                retries = int(retrying.statistics.get("attempt_number", 1))
                self.metrics.series(self.metrics.retries, self.service.name, "immediate").inc(
                    retries
                )

    def _technical_failure(
        self,
        tx: Tx,
        delivery: Delivery,
        decoded: Decoded,
        exc: Exception,
        tries: int,
    ) -> DeliveryOutcome:
        retried = self.failures.technical_failure(tx, delivery.body, decoded, exc, tries)
        return DeliveryOutcome.RETRY_SCHEDULED if retried else DeliveryOutcome.DEAD_LETTERED

    def _count(self, batch_size: int) -> None:
        """The committed batch's figures: its size, each delivery's outcome, latencies."""
        metrics = self.metrics
        if metrics is None:
            return
        consumer = self.service.name
        metrics.series(metrics.batch_size, consumer).observe(batch_size)
        committed = time.time()
        latency = metrics.series(metrics.delivery_latency, consumer)
        for created in self._staged.created:
            latency.observe(committed - created)
        handle_seconds = metrics.series(metrics.handle_seconds, consumer)
        for outcome, seconds in self._staged.handled:
            metrics.series(metrics.handled, consumer, outcome.value).inc()
            handle_seconds.observe(seconds)
            if outcome is DeliveryOutcome.RETRY_SCHEDULED:
                metrics.series(metrics.retries, consumer, "delayed").inc()
            elif outcome is DeliveryOutcome.DEAD_LETTERED:
                metrics.series(metrics.dead_lettered, consumer, "failed").inc()
            elif outcome is DeliveryOutcome.REJECTED:
                metrics.series(metrics.dead_lettered, consumer, "rejected").inc()

    @contextmanager
    def _conflicts_end_the_batch(self) -> Iterator[None]:
        """In a batch of several, a lock conflict becomes :class:`BatchConflict`."""
        try:
            yield
        except (*LOCK_CONFLICTS, ConcurrentUpdate) as exc:
            if self._in_batch:
                raise BatchConflict(f"{type(exc).__name__} in a batch: {exc}") from exc
            raise

    def _conflict_aware(self, tx: Tx, decoded: Decoded, careful: bool) -> DeliveryOutcome:
        with self._conflicts_end_the_batch():
            return self._attempt(tx, decoded, careful)

    def _attempt(self, tx: Tx, decoded: Decoded, careful: bool) -> DeliveryOutcome:
        envelope = decoded.envelope
        # Handled with care, a delivery's writes are undone alone (a service writing batches
        # at once stages its writes and guards its own savepoints); otherwise its segment's
        # savepoint covers them.
        if self._scope is not None:
            self._scope.guarded = careful
        guarded = careful and self._scope is None
        with _savepoint(tx) if guarded else nullcontext():
            ctx = HandlerContext(
                envelope, self.service.name, self.metrics, self.effects, batch=self._scope
            )
            closing = ctx.compensated_key if envelope.reply_to else None  # a command, not a reply
            if closing is not None:
                self.closed_steps.close(tx, self.service.name, closing)
                self._staged.closed.add(closing)  # its command later in this batch is refused
            result = decoded.spec.func(tx, decoded.message, ctx)
            self._reply(ctx, result, decoded)
            rows = self.outbox.rows(ctx.outgoing)  # checked now: a message too large fails here
        self._staged.rows.extend(rows)
        self._keep(ctx)
        return DeliveryOutcome.HANDLED

    def _keep(self, ctx: HandlerContext) -> None:
        """Remember the replies of a delivery that stays handled (its inbox row commits)."""
        self._staged.replies.extend((ctx.message_id, reply) for reply in ctx.replies)

    def _reply(self, ctx: HandlerContext, result: object, decoded: Decoded) -> None:
        """Send the handler's return value to ``reply_to``; None becomes an :class:`Ack`."""
        if result is None:
            ctx.reply(Ack())
            return
        if not isinstance(result, BaseModel):
            raise ConfigurationError(
                f"handler {decoded.spec.name} returned {type(result).__name__}; "
                "return a pydantic message (the reply) or None"
            )
        if ctx.reply(result) is None:
            raise ConfigurationError(
                f"handler {decoded.spec.name} returned a reply, but the "
                f"{decoded.envelope.type} message has no reply_to"
            )


def _unguarded(checked: list[Decoded | Rejection]) -> bool:
    """Whether deliveries may run with no savepoint: one alone, or several that all
    concern one saga (one saga's row and keys: no other batch's locks to wait for)."""
    if len(checked) == 1:
        return True
    sagas = {item.envelope.saga_id if isinstance(item, Decoded) else None for item in checked}
    return len(sagas) == 1 and None not in sagas


def _sent_at(delivery: Delivery, created_at: float) -> float:
    """When the message's outbox row committed, if its publisher said so; else its creation
    (earlier: an overestimate of the latency, for messages a relay published)."""
    stamp = (delivery.headers or {}).get(COMMITTED_AT_HEADER)
    try:
        return float(stamp) if stamp is not None else created_at
    except (TypeError, ValueError):
        return created_at


@contextmanager
def _savepoint(tx: Tx) -> Iterator[None]:
    """One delivery's writes, undone alone if it fails.

    Never released: a release costs a round trip per delivery, and the batch's
    commit ends every savepoint at once.
    """
    tx.execute("SAVEPOINT delivery", prepare=False)
    try:
        yield
    except BaseException:
        if not tx.broken:
            tx.execute("ROLLBACK TO SAVEPOINT delivery", prepare=False)
        raise


def _span_attributes(envelope: Envelope, consumer: str) -> dict[str, object]:
    """What a handler's span says about the delivery (names: saga.observability.tracing)."""
    return {
        tracing.SAGA_ID: envelope.saga_id,
        tracing.SAGA_STEP: envelope.headers.get(STEP_HEADER),
        tracing.MESSAGE_ID: envelope.message_id,
        tracing.MESSAGE_TYPE: envelope.type,
        tracing.CONVERSATION_ID: envelope.correlation_id,
        tracing.DESTINATION: consumer,  # messages are sent to a service by its name
        tracing.CONSUMER_GROUP: consumer,
        tracing.OPERATION_TYPE: "process",
    }
