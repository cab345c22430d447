"""Dead letters: messages that will not be processed without an operator.

The relay, the consumer runtime and the orchestrator all record them here,
one table per service database, with the reason and the exact body.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from saga.identifiers import render

_DEAD_LETTER = """
INSERT INTO {schema}.dead_letters
    (consumer, reason, message_id, message_type, saga_id, destination, content_type, body,
     error_type, error_message, traceback, attempts, first_failed_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, COALESCE(%s, now()))
RETURNING id
"""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that will not be processed without an operator."""

    consumer: str
    reason: str  # 'rejected' | 'failed' | 'unpublishable'
    body: bytes
    error_type: str
    error_message: str
    content_type: str | None = None
    message_id: UUID | None = None
    message_type: str | None = None
    saga_id: UUID | None = None
    destination: str | None = None
    traceback: str | None = None
    attempts: int = 1
    first_failed_at: datetime | None = None


class DeadLetterStore:
    """Dead-letter statements on one schema."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._dead_letter = render(_DEAD_LETTER, schema)

    def add(self, conn: psycopg.Connection[Any], letter: DeadLetter) -> int:
        """Record ``letter`` in the caller's transaction; return its id."""
        row = conn.execute(
            self._dead_letter,
            (
                letter.consumer,
                letter.reason,
                letter.message_id,
                letter.message_type,
                letter.saga_id,
                letter.destination,
                letter.content_type,
                letter.body,
                letter.error_type,
                letter.error_message,
                letter.traceback,
                letter.attempts,
                letter.first_failed_at,
            ),
        ).fetchone()
        assert row is not None
        return int(row[0])
