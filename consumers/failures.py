"""What becomes of a delivery that is not simply handled.

A business failure (:class:`StepFailed`) keeps its inbox row and answers the sender
with a :class:`FailureReply`; a command whose step this service already compensated
is refused without running; a technical failure is retried later through the outbox
or, once the policy gives up, becomes a dead letter (and a saga waiting for the
answer hears of it); a message that fails its checks is rejected as a dead letter
before any handler runs. Everything here writes on the batch's open transaction.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from saga.consumers.decoding import Decoded
from saga.consumers.inbox import Inbox
from saga.db.sql import Tx
from saga.errors import DeliveryLimitReached, MessageTooLarge, Rejection, StepFailed
from saga.handlers.context import HandlerContext
from saga.messaging.control import DEAD_LETTERED, STEP_CLOSED, FailureReply
from saga.messaging.dead_letters import DeadLetter, DeadLetterStore
from saga.messaging.envelope import ATTEMPT_HEADER, STEP_HEADER
from saga.messaging.outbox import Outbox, OutgoingMessage

logger = logging.getLogger(__name__)

FIRST_FAILED_HEADER = "first_failed_at"
LAST_ERROR_HEADER = "last_error"


@dataclass(frozen=True, slots=True)
class FailurePaths:
    """The writes of a failed, refused or rejected delivery, for one service."""

    consumer: str
    outbox: Outbox
    inbox: Inbox
    dead_letters: DeadLetterStore
    #: Keeps the replies a delivery sent with its inbox row (answers to duplicates).
    keep: Callable[[HandlerContext], None]

    def business_failure(self, tx: Tx, decoded: Decoded, failure: StepFailed) -> None:
        """The handler refused the command: its writes are gone, a failure reply is sent."""
        envelope = decoded.envelope
        ctx = HandlerContext(envelope, self.consumer)
        reply = FailureReply(reason=failure.reason, code=failure.code, failed_type=envelope.type)
        if ctx.reply(reply) is None:
            self.dead_letter_failure(tx, decoded, failure, tries=1)
        self.outbox.add_many(tx, ctx.outgoing)
        self.keep(ctx)
        logger.info(
            "%s refused %s: %s",
            self.consumer,
            envelope.type,
            failure.reason,
            extra=self._log_extra(decoded),
        )

    def refuse_closed(self, tx: Tx, decoded: Decoded) -> None:
        """Acknowledge a command whose step was compensated here, without running it."""
        envelope = decoded.envelope
        reason = (
            f"not executed: step {envelope.headers.get(STEP_HEADER)!r} was already "
            f"compensated by {self.consumer}"
        )
        ctx = HandlerContext(envelope, self.consumer)
        ctx.reply(FailureReply(reason=reason, code=STEP_CLOSED, failed_type=envelope.type))
        self.outbox.add_many(tx, ctx.outgoing)
        self.keep(ctx)
        logger.warning(
            "%s refused stale %s: %s",
            self.consumer,
            envelope.type,
            reason,
            extra=self._log_extra(decoded),
        )

    def technical_failure(
        self,
        tx: Tx,
        body: bytes,
        decoded: Decoded,
        exc: Exception,
        tries: int,
    ) -> bool:
        """Schedule the next try through the outbox, or dead-letter the message.

        Returns True when a retry was scheduled, False when it became a dead letter.
        """
        envelope = decoded.envelope
        # Not processed: the retry (same message id) or a later replay must get through.
        self.inbox.forget(tx, self.consumer, envelope.message_id)
        policy = decoded.spec.retry
        delay = policy.delay_after(envelope.attempt) if policy.is_retriable(exc) else None
        extra = self._log_extra(decoded)
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
                self.outbox.add_many(tx, [OutgoingMessage(retry, self.consumer, delay)])
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
                return True
        total = (envelope.attempt - 1) * policy.immediate_attempts + tries
        logger.error(
            "%s dead-lettered after %d attempts: %s: %s",
            envelope.type,
            total,
            type(exc).__name__,
            exc,
            extra=extra,
        )
        self.dead_letter_failure(tx, decoded, exc, tries=total, body=body)
        self._tell_sender(tx, decoded, f"dead-lettered after {total} attempts: {exc!r}")
        return False

    def delivery_limit_reached(
        self, tx: Tx, body: bytes, decoded: Decoded, deliveries: int
    ) -> None:
        """Dead-letter, without running its handler, a message whose earlier ``deliveries``
        all came back unsettled (the consumer died on it each time), so that the ones
        behind it flow again; a saga waiting for its answer hears of it."""
        self.inbox.forget(tx, self.consumer, decoded.envelope.message_id)  # for a replay
        reason = f"delivery limit reached after {deliveries} deliveries"
        logger.error(
            "%s dead-lettered: %s", decoded.envelope.type, reason, extra=self._log_extra(decoded)
        )
        error = DeliveryLimitReached(reason)
        self.dead_letter_failure(tx, decoded, error, tries=deliveries, body=body)
        self._tell_sender(tx, decoded, f"dead-lettered: {reason}")

    def dead_letter_failure(
        self,
        tx: Tx,
        decoded: Decoded,
        exc: BaseException,
        *,
        tries: int,
        body: bytes | None = None,
    ) -> None:
        envelope = decoded.envelope
        first = envelope.headers.get(FIRST_FAILED_HEADER)
        self.dead_letters.add(
            tx,
            DeadLetter(
                consumer=self.consumer,
                reason="failed",
                body=body if body is not None else envelope.to_bytes(),
                content_type="application/json",
                message_id=envelope.message_id,
                message_type=envelope.type,
                saga_id=envelope.saga_id,
                destination=self.consumer,
                error_type=type(exc).__name__,
                error_message=str(exc),
                traceback="".join(traceback.format_exception(exc)),
                attempts=tries,
                first_failed_at=datetime.fromisoformat(first) if first else None,
            ),
        )

    def dead_letter_poison(
        self,
        conn: psycopg.Connection[Any],
        body: bytes,
        content_type: str | None,
        error: BaseException,
    ) -> None:
        """Record a delivery whose transaction itself keeps failing, in a transaction of its own."""
        with conn.transaction():
            self.dead_letters.add(
                conn,
                DeadLetter(
                    consumer=self.consumer,
                    reason="failed",
                    body=body,
                    content_type=content_type,
                    error_type=type(error).__name__,
                    error_message=f"transaction kept failing: {error}",
                    traceback="".join(traceback.format_exception(error)),
                ),
            )

    def reject(
        self,
        tx: Tx,
        body: bytes,
        content_type: str | None,
        rejection: Rejection,
    ) -> None:
        """Record a message refused before any handler ran (it is acknowledged after)."""
        logger.warning(
            "%s rejected a message before any handler ran: %s: %s",
            self.consumer,
            rejection.error_type,
            rejection.message,
            extra={"consumer": self.consumer, "message_id": str(rejection.message_id)},
        )
        self.dead_letters.add(
            tx,
            DeadLetter(
                consumer=self.consumer,
                reason="rejected",
                body=body,
                content_type=content_type,
                message_id=rejection.message_id,
                message_type=rejection.message_type,
                saga_id=rejection.saga_id,
                destination=self.consumer,
                error_type=rejection.error_type,
                error_message=rejection.message,
            ),
        )

    def _tell_sender(self, tx: Tx, decoded: Decoded, reason: str) -> None:
        """A sender waiting for a reply (a saga) learns that its request became a dead letter."""
        ctx = HandlerContext(decoded.envelope, self.consumer)
        failure = FailureReply(reason=reason, code=DEAD_LETTERED, failed_type=decoded.envelope.type)
        if ctx.reply(failure) is not None:
            self.outbox.add_many(tx, ctx.outgoing)

    def _log_extra(self, decoded: Decoded) -> dict[str, str | None]:
        envelope = decoded.envelope
        return {
            "consumer": self.consumer,
            "message_id": str(envelope.message_id),
            "saga_id": str(envelope.saga_id) if envelope.saga_id else None,
        }
