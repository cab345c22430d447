"""Retry policy for technical failures (any exception but ``StepFailed``).

A failing delivery is first retried in process (``immediate_attempts`` tries,
exponential backoff with jitter, through tenacity). If it still fails, it is
re-scheduled through the outbox with ``deliver_after`` (one per entry of
``delays``), so no worker waits for it. When those run out too, the message
becomes a dead letter. The count travels in the envelope's ``attempt``
header: it is ours, not the broker's.

Errors that no retry can mend (:data:`DETERMINISTIC_ERRORS`: data PostgreSQL
refuses, such as a NUL character in a text field, SQL errors, the framework's
configuration errors such as a reply without ``reply_to``, a message sent over
the size cap, saga data that cannot be stored) become dead letters at once.
Set ``deterministic=()`` to retry them like any other failure.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from datetime import timedelta

import psycopg
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from saga.errors import (
    BatchConflict,
    ConfigurationError,
    MessageTooLarge,
    SagaDataRefused,
    StepFailed,
)

#: Failures that fail the same way on every try: dead-lettered without a retry by default.
DETERMINISTIC_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.DataError,
    psycopg.ProgrammingError,
    ConfigurationError,
    MessageTooLarge,  # a message the handler sends is over the cap
    SagaDataRefused,  # a reply or event that makes saga data unstorable
)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a failing handler is tried again.

    Total handler calls before a dead letter: ``immediate_attempts * (len(delays) + 1)``.
    """

    immediate_attempts: int = 3
    immediate_initial_wait: float = 0.02
    immediate_max_wait: float = 0.5
    delays: tuple[float, ...] = (1.0, 10.0, 60.0)
    delay_jitter: float = 0.2
    never_retry: tuple[type[BaseException], ...] = ()
    deterministic: tuple[type[BaseException], ...] = DETERMINISTIC_ERRORS

    def __post_init__(self) -> None:
        if self.immediate_attempts < 1:
            raise ConfigurationError("immediate_attempts must be at least 1")
        if any(d < 0 for d in self.delays):
            raise ConfigurationError("retry delays must not be negative")
        if not 0 <= self.delay_jitter < 1:
            raise ConfigurationError("delay_jitter must be in [0, 1)")

    @property
    def total_attempts(self) -> int:
        return self.immediate_attempts * (len(self.delays) + 1)

    def is_retriable(self, exc: BaseException) -> bool:
        return not isinstance(
            exc, (StepFailed, BatchConflict, *self.never_retry, *self.deterministic)
        )

    def retries(self) -> Retrying:
        """A tenacity controller for the tries after a failed first one.

        It waits before its first try too, so every two tries of a delivery are
        apart by exponential backoff (initial wait, doubling, capped) with jitter.
        """
        first_wait = self.immediate_initial_wait
        return Retrying(
            stop=stop_after_attempt(self.immediate_attempts - 1),
            wait=wait_exponential(
                multiplier=self.immediate_initial_wait * 2, max=self.immediate_max_wait
            )
            + wait_random(0, self.immediate_initial_wait),
            before=lambda state: time.sleep(first_wait) if state.attempt_number == 1 else None,
            retry=retry_if_exception(self.is_retriable),
            reraise=True,
        )

    def delay_after(self, delivery_attempt: int) -> timedelta | None:
        """Delay before delivery ``delivery_attempt + 1``, or None when none is left."""
        if delivery_attempt > len(self.delays):
            return None
        base = self.delays[delivery_attempt - 1]
        spread = base * self.delay_jitter
        return timedelta(seconds=max(0.0, base + random.uniform(-spread, spread)))
