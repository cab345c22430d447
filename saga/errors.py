"""The framework's exceptions: one root, a few meaningful branches.

Errors raised by psycopg or kombu are translated at the boundary into one of
these, keeping the original as ``__cause__``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from uuid import UUID


class SagaError(Exception):
    """Root of every error this framework raises on purpose."""


class ConfigurationError(SagaError):
    """Settings or a definition are invalid; fix the configuration, not the data."""


class InvalidIdentifier(ConfigurationError):
    """A schema, queue or consumer name is not a safe identifier."""


class EventsNotSupported(ConfigurationError):
    """Events (publish/subscribe) on a broker that cannot fan them out safely (Redis)."""


class MessageTooLarge(SagaError):
    """A message body exceeds the configured cap; nothing was written."""

    def __init__(self, size: int, limit: int, message_type: str) -> None:
        super().__init__(
            f"{message_type} message is {size} bytes, over the {limit}-byte cap; "
            "store large data elsewhere and send its id (claim check)"
        )
        self.size = size
        self.limit = limit
        self.message_type = message_type


class UnknownMessageType(SagaError):
    """A message names a type that nothing here has registered."""


class MigrationError(SagaError):
    """The database schema could not be brought to the expected version."""


class DatabaseUnavailable(SagaError):
    """PostgreSQL could not be reached (after retries)."""


class UnsafeDurability(ConfigurationError):
    """The database session or the broker could lose committed rows or messages on a crash."""


class PublishNotConfirmed(SagaError):
    """The broker neither confirmed nor refused published messages in time: their fate is
    unknown, so their outbox rows stay and the publisher reconnects (a transient error)."""


class StepFailed(SagaError):
    """A business failure: the step's writes are undone and a failure reply is sent.

    Raise it from a handler when the request cannot be honoured (insufficient
    credit, out of stock). It is not retried: the saga compensates instead.
    """

    def __init__(self, reason: str, *, code: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class IdempotencyKeyTaken(SagaError):
    """A saga with this start's idempotency key exists: the start undoes what it ran and
    returns that saga's id (never raised out of ``start``)."""


class IdempotencyKeyReused(SagaError):
    """A start reused an idempotency key with other data than the saga it started: a key
    names one request, so the start is refused and nothing is written."""


class UnknownSaga(SagaError):
    """A message names a saga instance this database does not have (retried, then dead-lettered)."""


class StaleReply(SagaError):
    """A reply or timer for a step the saga is not waiting on (retried, then dead-lettered)."""


class UnexpectedReply(SagaError):
    """A reply of a type the waiting step does not accept."""


class NotCancellable(SagaError):
    """The saga cannot be cancelled in its current state (finished, or past its pivot)."""


class SagaDataRefused(SagaError):
    """Saga data that cannot be stored as it is; nothing was written."""


class SagaDataTooLarge(SagaDataRefused):
    """Saga data over its cap; nothing was written (store large data in a claim check)."""

    def __init__(self, saga: str, size: int, limit: int) -> None:
        super().__init__(
            f"saga {saga!r} data is {size} bytes, over the {limit}-byte cap; keep large "
            "content in a claim check (saga.effects.claimcheck) and put its id in the data"
        )
        self.size = size
        self.limit = limit


class SignalRejected(SagaError):
    """A signal for a saga that does not exist, is not waiting for it, or with bad data."""


class LockLost(SagaError):
    """The lock expired or could not be renewed while it was held."""


class LockTimeout(SagaError):
    """The lock could not be acquired in time."""


class ClaimNotFound(SagaError):
    """No content is stored under this claim id (never stored, deleted or expired)."""


class SideEffectFailed(SagaError):
    """The call failed permanently before (recorded); it is not attempted again."""


class SideEffectBusy(SagaError):
    """Another attempt holds the key and did not finish in time (retried later)."""


class LeaseLost(SagaError):
    """The call outlived its lease and another attempt took the key over."""


class BatchConflict(SagaError):
    """A lock conflict (deadlock, serialization failure) inside a batch of deliveries.

    Retrying it inside the batch would keep every lock the batch holds; the
    whole batch is rolled back instead and its deliveries handled one by one.
    """


class LoneDeliveryFailed(SagaError):
    """The handler of a delivery handled with no savepoint (alone in its transaction, or
    with others for the same saga) failed: the one at ``index`` of its transaction.

    The consumer runtime rolls the whole transaction back and takes the delivery's
    failure path in a new one; ``error`` is what the handler raised (a
    :class:`NeedsSavepoint`: run it again with a savepoint).
    """

    def __init__(self, error: Exception, index: int) -> None:
        super().__init__(f"a handler with no savepoint failed: {error!r}")
        self.error = error
        self.index = index


class NeedsSavepoint(SagaError):
    """A local step failed in a delivery handled without a savepoint of its own.

    Its writes cannot be undone alone there: the consumer runtime rolls the delivery's
    segment back and handles it again with a savepoint, where the failure takes its
    course (the saga compensates, or the delivery is retried).
    """


class ConcurrentUpdate(SagaError):
    """Another transaction changed the saga first; the handler is retried."""


class SignatureRejected(SagaError):
    """A delivery whose signature is missing, unknown or wrong (``error_type`` says which)."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message


class DeliveryLimitReached(SagaError):
    """A message its consumer kept dying on (quorum queues count its deliveries): recorded
    as a dead letter's error instead of running its handler again."""


class DeadLetterNotFound(SagaError):
    """No dead letter has this id."""


class NotReplayable(SagaError):
    """This letter cannot be sent again (its body is not a message envelope, or it was purged)."""


class NotResumable(SagaError):
    """The saga is finished, or still making progress."""


class ActionRefused(SagaError):
    """A dashboard action without a valid operator session and CSRF token (or on a
    dashboard started without ``SAGA_DASHBOARD_TOKEN``, which is read-only)."""


class Rejection(SagaError):
    """A delivery that cannot be handled, with the reason it was turned away, and what
    its envelope said of it when it had one that could be read (for the dead letter)."""

    def __init__(
        self,
        error_type: str,
        message: str,
        *,
        message_id: UUID | None = None,
        message_type: str | None = None,
        saga_id: UUID | None = None,
    ) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.message_id = message_id
        self.message_type = message_type
        self.saga_id = saga_id


class PayloadMismatch(SagaError, AssertionError):
    """A test's expected message differs from the one sent (saga.testing); the text
    shows both side by side."""


class HarnessSetupError(ConfigurationError):
    """saga.testing cannot get a test database (no server, no right to create one), or
    cannot read the ``schema=`` it was given; the message says what to do."""


class ForeignDatabase(HarnessSetupError):
    """The database named for saga.testing holds tables the harness did not create:
    emptying it before each test would delete them, so the harness refuses it and
    changes nothing."""
