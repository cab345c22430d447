"""The framework's exceptions: one root, a few meaningful branches.

Errors raised by psycopg or kombu are translated at the boundary into one of
these, keeping the original as ``__cause__``.
"""

from __future__ import annotations


class SagaError(Exception):
    """Root of every error this framework raises on purpose."""


class ConfigurationError(SagaError):
    """Settings or a definition are invalid; fix the configuration, not the data."""


class InvalidIdentifier(ConfigurationError):
    """A schema, queue or consumer name is not a safe identifier."""


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


class StepFailed(SagaError):
    """A business failure: the step's writes are undone and a failure reply is sent.

    Raise it from a handler when the request cannot be honoured (insufficient
    credit, out of stock). It is not retried: the saga compensates instead.
    """

    def __init__(self, reason: str, *, code: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class UnknownSaga(SagaError):
    """A message names a saga instance this database does not have (retried, then dead-lettered)."""


class StaleReply(SagaError):
    """A reply or timer for a step the saga is not waiting on (retried, then dead-lettered)."""


class UnexpectedReply(SagaError):
    """A reply of a type the waiting step does not accept."""


class NotCancellable(SagaError):
    """The saga cannot be cancelled in its current state (finished, or past its pivot)."""


class SagaDataTooLarge(SagaError):
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
