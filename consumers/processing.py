"""Handling a batch of deliveries in ONE database transaction.

First the inbox rows ``(consumer, message_id)`` of the whole batch, in one
statement: a message whose row was already there was processed before and is
skipped. Then per delivery, inside a savepoint: run the handler on the open
transaction and write the messages it sends to the outbox. A failing handler
rolls back only its own savepoint; a message that ends up retried later or
dead-lettered gets its inbox row removed again. The replies sent for the batch's
handled messages are kept with their inbox rows (one statement, when there are
any); a duplicate is answered again with the replies kept for it (one statement,
when there are duplicates), so a saga whose reply a broker lost gets it when the
saga is resumed. The caller commits once for the whole batch, then acknowledges.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from functools import partial
from typing import Any
from uuid import UUID

import psycopg
from pydantic import BaseModel

from saga.consumers.decoding import Decoded, decode
from saga.consumers.inbox import Inbox
from saga.effects.side_effects import SideEffects
from saga.errors import (
    BatchConflict,
    ConcurrentUpdate,
    ConfigurationError,
    MessageTooLarge,
    Rejection,
    SignatureRejected,
    StepFailed,
)
from saga.faults import fault_point
from saga.handlers.batching import BatchScope
from saga.handlers.closed_steps import ClosedSteps
from saga.handlers.context import HandlerContext
from saga.handlers.service import Service
from saga.messaging.control import DEAD_LETTERED, STEP_CLOSED, Ack, FailureReply
from saga.messaging.dead_letters import DeadLetter, DeadLetterStore
from saga.messaging.envelope import (
    ATTEMPT_HEADER,
    COMMITTED_AT_HEADER,
    STEP_HEADER,
    Envelope,
)
from saga.messaging.outbox import Outbox, OutboxRow, OutgoingMessage
from saga.messaging.signing import KeyRing
from saga.observability import tracing
from saga.observability.logs import log_context
from saga.observability.metrics import Metrics

logger = logging.getLogger(__name__)

FIRST_FAILED_HEADER = "first_failed_at"
LAST_ERROR_HEADER = "last_error"


#: Errors that mean "another transaction holds what this one needs": retried in a short
#: transaction of their own rather than inside a batch that holds other locks.
LOCK_CONFLICTS = (
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
    psycopg.errors.LockNotAvailable,
)


class Outcome(StrEnum):
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


class BatchProcessor:
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
    ) -> None:
        self.service = service
        self.metrics = metrics
        self.signing = signing
        self.effects = effects
        self._created: list[float] = []
        #: (handled message id, reply) of the batch, kept with the inbox before it commits
        self._replies: list[tuple[UUID, OutgoingMessage]] = []
        #: outbox rows the batch's handlers sent, written in one statement before it commits
        self._rows: list[OutboxRow] = []
        #: the service's staged writes for this batch, when it writes batches at once
        self._scope: BatchScope | None = None
        self._in_batch = False
        self.batch_lock_timeout_ms = batch_lock_timeout_ms
        self.outbox = outbox or Outbox(schema)
        self.inbox = Inbox(schema)
        self.closed_steps = ClosedSteps(schema)
        self._closed: set[str] = set()
        self.dead_letters = DeadLetterStore(schema)
        self.max_message_bytes = max_message_bytes or self.outbox.max_message_bytes

    def process(
        self, conn: psycopg.Connection[Any], deliveries: Sequence[Delivery]
    ) -> list[Outcome]:
        """Handle ``deliveries`` and commit them together; return one outcome each.

        Raises :class:`BatchConflict` when a handler hits a lock conflict in a batch of
        several: the caller then handles the deliveries one per transaction.
        """
        self._created = []
        self._replies = []
        self._rows = []
        self._scope = None
        self._in_batch = len(deliveries) > 1
        checked = [self._check(delivery) for delivery in deliveries]
        with conn.transaction():
            if self._in_batch and self.batch_lock_timeout_ms:
                # A batch holds many rows' locks: give up waiting early, then go one by one.
                conn.execute(f"SET LOCAL lock_timeout = {int(self.batch_lock_timeout_ms)}")
            fresh = self._record_inbox(conn, checked)
            self._answer_duplicates(conn, checked, fresh)
            self._closed = self._find_closed(conn, checked, fresh)
            self._scope = self._open_scope(conn, checked, fresh)
            outcomes = [
                self._handle(conn, delivery, item, fresh)
                for delivery, item in zip(deliveries, checked, strict=True)
            ]
            if self._scope is not None:
                with self._conflicts_end_the_batch():
                    self._scope.flush(conn)
            self.outbox.insert_rows(conn, self._rows)
            if self._replies:
                self.inbox.keep_replies(conn, self.service.name, self._replies)
            fault_point("consumer.before_commit")
        fault_point("consumer.after_commit")
        if self.metrics is not None:
            self.metrics.batch_size.labels(self.service.name).observe(len(deliveries))
            committed = time.time()
            latency = self.metrics.delivery_latency.labels(self.service.name)
            for created in self._created:
                latency.observe(committed - created)
        return outcomes

    def dead_letter_poison(
        self, conn: psycopg.Connection[Any], delivery: Delivery, error: BaseException
    ) -> None:
        """Record a delivery whose transaction itself keeps failing, in a transaction of its own."""
        with conn.transaction():
            self.dead_letters.add(
                conn,
                DeadLetter(
                    consumer=self.service.name,
                    reason="failed",
                    body=delivery.body,
                    content_type=delivery.content_type,
                    error_type=type(error).__name__,
                    error_message=f"transaction kept failing: {error}",
                    traceback="".join(traceback.format_exception(error)),
                ),
            )

    # -- one delivery --------------------------------------------------------

    def _check(self, delivery: Delivery) -> Decoded | Rejection:
        """Signature and decoding, before the transaction: the message, or why it is refused."""
        signing = self.signing
        check = None if signing is None else partial(signing.verify, headers=delivery.headers)
        try:
            body, content_type = delivery.body, delivery.content_type
            return decode(body, content_type, self.service, self.max_message_bytes, check)
        except SignatureRejected as bad:
            return Rejection(bad.error_type, bad.message)
        except Rejection as rejection:
            return rejection

    def _record_inbox(
        self, conn: psycopg.Connection[Any], checked: list[Decoded | Rejection]
    ) -> set[UUID]:
        """Inbox rows for every decoded delivery at once; the ids not processed before."""
        ids = [item.envelope.message_id for item in checked if isinstance(item, Decoded)]
        if not ids:
            return set()
        with self._conflicts_end_the_batch():  # the same message in another open batch
            return self.inbox.record(conn, self.service.name, ids)

    def _answer_duplicates(
        self, conn: psycopg.Connection[Any], checked: list[Decoded | Rejection], fresh: set[UUID]
    ) -> None:
        """Send again what this consumer replied to the messages it had handled before."""
        again = [
            item.envelope.message_id
            for item in checked
            if isinstance(item, Decoded) and item.envelope.message_id not in fresh
        ]
        if not again:
            return
        written = self.inbox.answer_again(conn, self.service.name, again)
        self.outbox.written(conn, written)
        if written:
            logger.info(
                "%s answered %d duplicate(s) again with %d kept reply(ies)",
                self.service.name,
                len(again),
                len(written),
                extra={"consumer": self.service.name},
            )

    def _open_scope(
        self, conn: psycopg.Connection[Any], checked: list[Decoded | Rejection], fresh: set[UUID]
    ) -> BatchScope | None:
        """The service's batch scope, for a batch of several new deliveries (else None)."""
        writing = self.service.batch_writing
        if writing is None:
            return None
        envelopes = [
            item.envelope
            for item in checked
            if isinstance(item, Decoded) and item.envelope.message_id in fresh
        ]
        if len(envelopes) < 2:
            return None
        return writing.open(conn, envelopes)

    def _find_closed(
        self, conn: psycopg.Connection[Any], checked: list[Decoded | Rejection], fresh: set[UUID]
    ) -> set[str]:
        """The step keys of this batch's new forward commands whose steps were compensated."""
        keys = [
            key
            for item in checked
            if isinstance(item, Decoded)
            and item.envelope.message_id in fresh
            and (key := item.envelope.step_key) is not None
        ]
        if not keys:
            return set()
        with self._conflicts_end_the_batch():  # a compensation of the same step in flight
            return self.closed_steps.lock_and_find(conn, keys)

    def _handle(
        self,
        conn: psycopg.Connection[Any],
        delivery: Delivery,
        item: Decoded | Rejection,
        fresh: set[UUID],
    ) -> Outcome:
        started = time.perf_counter()
        if isinstance(item, Rejection):
            outcome = self._reject(conn, delivery, item)
        elif item.envelope.message_id not in fresh:
            outcome = Outcome.DUPLICATE
        elif item.envelope.step_key in self._closed:
            fresh.discard(item.envelope.message_id)
            outcome = self._refuse_closed(conn, item)
        else:
            fresh.discard(item.envelope.message_id)  # a second copy in this batch is a duplicate
            decoded, envelope = item, item.envelope
            self._created.append(_sent_at(delivery, envelope.created_at.timestamp()))
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
                outcome = self._run(conn, delivery, decoded)
        self._count(outcome, time.perf_counter() - started)
        return outcome

    def _run(self, conn: psycopg.Connection[Any], delivery: Delivery, decoded: Decoded) -> Outcome:
        try:  # the common case: one try, no retry controller built
            return self._conflict_aware(conn, decoded)
        except BatchConflict:
            raise
        except StepFailed as failure:
            return self._business_failure(conn, decoded, failure)
        except Exception as exc:
            policy = decoded.spec.retry
            if not policy.is_retriable(exc) or policy.immediate_attempts == 1:
                return self._technical_failure(conn, delivery, decoded, exc, 1)
        return self._retry(conn, delivery, decoded)

    def _retry(
        self, conn: psycopg.Connection[Any], delivery: Delivery, decoded: Decoded
    ) -> Outcome:
        """The first try failed: the policy's other immediate tries (tenacity), then the rest."""
        retrying = decoded.spec.retry.retries()
        try:
            for attempt in retrying:
                with attempt:
                    outcome = self._conflict_aware(conn, decoded)
            return outcome
        except BatchConflict:
            raise
        except StepFailed as failure:
            return self._business_failure(conn, decoded, failure)
        except Exception as exc:
            tries = 1 + int(retrying.statistics.get("attempt_number", 1))
            return self._technical_failure(conn, delivery, decoded, exc, tries)
        finally:
            if self.metrics is not None:
                retries = int(retrying.statistics.get("attempt_number", 1))
                self.metrics.retries.labels(self.service.name, "immediate").inc(retries)

    def _count(self, outcome: Outcome, seconds: float) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        consumer = self.service.name
        metrics.handled.labels(consumer, outcome.value).inc()
        metrics.handle_seconds.labels(consumer).observe(seconds)
        if outcome is Outcome.RETRY_SCHEDULED:
            metrics.retries.labels(consumer, "delayed").inc()
        elif outcome is Outcome.DEAD_LETTERED:
            metrics.dead_lettered.labels(consumer, "failed").inc()
        elif outcome is Outcome.REJECTED:
            metrics.dead_lettered.labels(consumer, "rejected").inc()

    @contextmanager
    def _conflicts_end_the_batch(self) -> Iterator[None]:
        """In a batch of several, a lock conflict becomes :class:`BatchConflict`."""
        try:
            yield
        except (*LOCK_CONFLICTS, ConcurrentUpdate) as exc:
            if self._in_batch:
                raise BatchConflict(f"{type(exc).__name__} in a batch: {exc}") from exc
            raise

    def _conflict_aware(self, conn: psycopg.Connection[Any], decoded: Decoded) -> Outcome:
        with self._conflicts_end_the_batch():
            return self._attempt(conn, decoded)

    def _attempt(self, conn: psycopg.Connection[Any], decoded: Decoded) -> Outcome:
        envelope = decoded.envelope
        # A service writing batches at once stages its writes and guards its own savepoints.
        with _savepoint(conn) if self._scope is None else nullcontext():
            ctx = HandlerContext(
                envelope, self.service.name, self.metrics, self.effects, batch=self._scope
            )
            closing = ctx.compensated_key if envelope.reply_to else None  # a command, not a reply
            if closing is not None:
                self.closed_steps.close(conn, self.service.name, closing)
                self._closed.add(closing)  # its command later in this batch is refused too
            result = decoded.spec.func(conn, decoded.message, ctx)
            self._reply(ctx, result, decoded)
            rows = self.outbox.rows(ctx.outgoing)  # checked now: a message too large fails here
        self._rows.extend(rows)
        self._keep(ctx)
        return Outcome.HANDLED

    def _keep(self, ctx: HandlerContext) -> None:
        """Remember the replies of a delivery that stays handled (its inbox row commits)."""
        self._replies.extend((ctx.message_id, reply) for reply in ctx.replies)

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

    def _business_failure(
        self, conn: psycopg.Connection[Any], decoded: Decoded, failure: StepFailed
    ) -> Outcome:
        envelope = decoded.envelope
        ctx = HandlerContext(envelope, self.service.name)
        reply = FailureReply(reason=failure.reason, code=failure.code, failed_type=envelope.type)
        if ctx.reply(reply) is None:
            self._dead_letter_failure(conn, decoded, failure, tries=1)
        self.outbox.add_many(conn, ctx.outgoing)
        self._keep(ctx)
        logger.info(
            "%s refused %s: %s",
            self.service.name,
            envelope.type,
            failure.reason,
            extra=_log_extra(decoded, self.service.name),
        )
        return Outcome.BUSINESS_FAILURE

    def _refuse_closed(self, conn: psycopg.Connection[Any], decoded: Decoded) -> Outcome:
        """Acknowledge a command whose step was compensated here, without running it."""
        envelope = decoded.envelope
        reason = (
            f"not executed: step {envelope.headers.get(STEP_HEADER)!r} was already "
            f"compensated by {self.service.name}"
        )
        ctx = HandlerContext(envelope, self.service.name)
        ctx.reply(FailureReply(reason=reason, code=STEP_CLOSED, failed_type=envelope.type))
        self.outbox.add_many(conn, ctx.outgoing)
        self._keep(ctx)
        logger.warning(
            "%s refused stale %s: %s",
            self.service.name,
            envelope.type,
            reason,
            extra=_log_extra(decoded, self.service.name),
        )
        return Outcome.STALE

    def _technical_failure(
        self,
        conn: psycopg.Connection[Any],
        delivery: Delivery,
        decoded: Decoded,
        exc: Exception,
        tries: int,
    ) -> Outcome:
        envelope = decoded.envelope
        # Not processed: the retry (same message id) or a later replay must get through.
        self.inbox.forget(conn, self.service.name, envelope.message_id)
        policy = decoded.spec.retry
        delay = policy.delay_after(envelope.attempt) if policy.is_retriable(exc) else None
        extra = _log_extra(decoded, self.service.name)
        if delay is not None:
            retry = envelope.with_headers(
                **{
                    ATTEMPT_HEADER: str(envelope.attempt + 1),
                    FIRST_FAILED_HEADER: envelope.headers.get(FIRST_FAILED_HEADER)
                    or datetime.now(UTC).isoformat(),
                    LAST_ERROR_HEADER: f"{type(exc).__name__}: {exc}"[:500],
                }
            )
            try:
                self.outbox.add_many(conn, [OutgoingMessage(retry, self.service.name, delay)])
            except MessageTooLarge:
                pass  # the headers pushed it over the cap: dead-letter it instead
            else:
                logger.warning(
                    "%s failed on attempt %d (%s: %s); retrying in %.1fs",
                    envelope.type,
                    envelope.attempt,
                    type(exc).__name__,
                    exc,
                    delay.total_seconds(),
                    extra=extra,
                )
                return Outcome.RETRY_SCHEDULED
        total = (envelope.attempt - 1) * policy.immediate_attempts + tries
        logger.error(
            "%s dead-lettered after %d attempts: %s: %s",
            envelope.type,
            total,
            type(exc).__name__,
            exc,
            extra=extra,
        )
        self._dead_letter_failure(conn, decoded, exc, tries=total, body=delivery.body)
        self._tell_sender(conn, decoded, f"dead-lettered after {total} attempts: {exc!r}")
        return Outcome.DEAD_LETTERED

    def _tell_sender(self, conn: psycopg.Connection[Any], decoded: Decoded, reason: str) -> None:
        """A sender waiting for a reply (a saga) learns that its request became a dead letter."""
        ctx = HandlerContext(decoded.envelope, self.service.name)
        failure = FailureReply(reason=reason, code=DEAD_LETTERED, failed_type=decoded.envelope.type)
        if ctx.reply(failure) is not None:
            self.outbox.add_many(conn, ctx.outgoing)

    def _dead_letter_failure(
        self,
        conn: psycopg.Connection[Any],
        decoded: Decoded,
        exc: BaseException,
        *,
        tries: int,
        body: bytes | None = None,
    ) -> None:
        envelope = decoded.envelope
        first = envelope.headers.get(FIRST_FAILED_HEADER)
        self.dead_letters.add(
            conn,
            DeadLetter(
                consumer=self.service.name,
                reason="failed",
                body=body if body is not None else envelope.to_bytes(),
                content_type="application/json",
                message_id=envelope.message_id,
                message_type=envelope.type,
                saga_id=envelope.saga_id,
                destination=self.service.name,
                error_type=type(exc).__name__,
                error_message=str(exc),
                traceback="".join(traceback.format_exception(exc)),
                attempts=tries,
                first_failed_at=datetime.fromisoformat(first) if first else None,
            ),
        )

    def _reject(
        self, conn: psycopg.Connection[Any], delivery: Delivery, rejection: Rejection
    ) -> Outcome:
        envelope = rejection.envelope
        logger.warning(
            "%s rejected a message before any handler ran: %s: %s",
            self.service.name,
            rejection.error_type,
            rejection.message,
            extra={"consumer": self.service.name, "message_id": str(rejection.message_id)},
        )
        self.dead_letters.add(
            conn,
            DeadLetter(
                consumer=self.service.name,
                reason="rejected",
                body=delivery.body,
                content_type=delivery.content_type,
                message_id=rejection.message_id,
                message_type=envelope.type if envelope else None,
                saga_id=envelope.saga_id if envelope else None,
                destination=self.service.name,
                error_type=rejection.error_type,
                error_message=rejection.message,
            ),
        )
        return Outcome.REJECTED


def _sent_at(delivery: Delivery, created_at: float) -> float:
    """When the message's outbox row committed, if its publisher said so; else its creation
    (earlier: an overestimate of the latency, for messages a relay published)."""
    stamp = (delivery.headers or {}).get(COMMITTED_AT_HEADER)
    try:
        return float(stamp) if stamp is not None else created_at
    except (TypeError, ValueError):
        return created_at


@contextmanager
def _savepoint(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """One delivery's writes, undone alone if it fails.

    Never released: a release costs a round trip per delivery, and the batch's
    commit ends every savepoint at once.
    """
    conn.execute("SAVEPOINT delivery", prepare=False)
    try:
        yield
    except BaseException:
        if not conn.broken:
            conn.execute("ROLLBACK TO SAVEPOINT delivery", prepare=False)
        raise


def _log_extra(decoded: Decoded, consumer: str) -> dict[str, str | None]:
    envelope = decoded.envelope
    return {
        "consumer": consumer,
        "message_id": str(envelope.message_id),
        "saga_id": str(envelope.saga_id) if envelope.saga_id else None,
    }


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
