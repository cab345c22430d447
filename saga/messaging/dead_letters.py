"""Dead letters: messages that will not be processed without an operator.

The relay, the consumer runtime and the orchestrator all record them here,
one table per service database, with the reason and the exact body.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from saga.db.sql import Tx, render

_DEAD_LETTER = """
INSERT INTO {schema}.dead_letters
    (consumer, reason, message_id, message_type, saga_id, destination, content_type, body,
     error_type, error_message, traceback, attempts, first_failed_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, COALESCE(%s, now()))
RETURNING id
"""


_ROW_COLUMNS = """id, consumer, reason, message_id, message_type, saga_id, destination,
    content_type, body, error_type, error_message, traceback, attempts, first_failed_at,
    last_failed_at, status, replay_count, last_replayed_at"""

_LIST = (
    "SELECT "
    + _ROW_COLUMNS
    + """ FROM {schema}.dead_letters
WHERE (%(consumer)s::text IS NULL OR consumer = %(consumer)s)
  AND (%(error_type)s::text IS NULL OR error_type = %(error_type)s)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(since)s::interval IS NULL OR last_failed_at >= now() - %(since)s::interval)
  AND (%(before)s::timestamptz IS NULL OR last_failed_at < %(before)s::timestamptz)
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
  AND (%(saga_id)s::uuid IS NULL OR saga_id = %(saga_id)s::uuid)
ORDER BY id
LIMIT %(limit)s
"""
)

_GROUPS = """
SELECT consumer, reason, error_type, letters, oldest, newest FROM {schema}.dead_letter_summary
ORDER BY letters DESC, consumer, reason, error_type
"""

_LOCK = """
SELECT id, status, replay_count FROM {schema}.dead_letters WHERE id = ANY(%b::bigint[]) FOR UPDATE
"""

_MARK_REPLAYED = """
UPDATE {schema}.dead_letters
SET status = 'replayed', replay_count = replay_count + 1, last_replayed_at = now()
WHERE id = ANY(%b::bigint[])
"""

_RECORD_REPLAY = """
INSERT INTO {schema}.dead_letter_replays
    (criteria, dead_letter_ids, replayed, refused, result)
VALUES (%s, %s, %s, %s, %s)
RETURNING id
"""

_PURGE = """
UPDATE {schema}.dead_letters SET status = 'purged', purged_at = now()
WHERE id = ANY(%b::bigint[]) AND status <> 'purged'
"""


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """A stored dead letter, as ``saga dlq`` shows it."""

    id: int
    consumer: str
    reason: str
    message_id: UUID | None
    message_type: str | None
    saga_id: UUID | None
    destination: str | None
    content_type: str | None
    body: bytes
    error_type: str
    error_message: str
    traceback: str | None
    attempts: int
    first_failed_at: datetime
    last_failed_at: datetime
    status: str
    replay_count: int
    last_replayed_at: datetime | None


@dataclass(frozen=True, slots=True)
class DeadLetterGroup:
    """Pending dead letters of one consumer, reason and error type (how they are triaged)."""

    consumer: str
    reason: str
    error_type: str
    letters: int
    oldest: datetime
    newest: datetime


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead letters an operation applies to (None means any)."""

    ids: Sequence[int] | None = None
    consumer: str | None = None
    error_type: str | None = None
    reason: str | None = None
    status: str | None = "pending"
    since: timedelta | None = None
    before: datetime | None = None
    saga_id: UUID | None = None
    limit: int = 100_000

    def describe(self) -> dict[str, Any]:
        return {
            k: (str(v) if isinstance(v, timedelta | datetime) else v)
            for k, v in {
                "ids": list(self.ids) if self.ids is not None else None,
                "consumer": self.consumer,
                "error_type": self.error_type,
                "reason": self.reason,
                "status": self.status,
                "since": self.since,
                "before": self.before,
            }.items()
            if v is not None
        }


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
        self._list = render(_LIST, schema)
        self._lock = render(_LOCK, schema)
        self._groups = render(_GROUPS, schema)
        self._mark_replayed = render(_MARK_REPLAYED, schema)
        self._record_replay = render(_RECORD_REPLAY, schema)
        self._purge = render(_PURGE, schema)

    def add(self, tx: Tx, letter: DeadLetter) -> int:
        """Record ``letter`` in the caller's transaction; return its id."""
        row = tx.execute(
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

    def find(self, tx: Tx, where: DeadLetterFilter) -> list[DeadLetterRow]:
        rows = tx.execute(
            self._list,
            {
                "consumer": where.consumer,
                "error_type": where.error_type,
                "reason": where.reason,
                "status": where.status,
                "since": where.since,
                "before": where.before,
                "ids": list(where.ids) if where.ids is not None else None,
                "saga_id": where.saga_id,
                "limit": where.limit,
            },
        ).fetchall()
        return [_row(list(values)) for values in rows]

    def groups(self, tx: Tx) -> list[DeadLetterGroup]:
        """Pending letters grouped by consumer, reason and error type, largest group first."""
        return [DeadLetterGroup(*row) for row in tx.execute(self._groups)]

    def get(self, tx: Tx, letter_id: int) -> DeadLetterRow | None:
        found = self.find(tx, DeadLetterFilter(ids=[letter_id], status=None, limit=1))
        return found[0] if found else None

    def lock(self, tx: Tx, ids: Sequence[int]) -> dict[int, tuple[str, int]]:
        """Lock rows for the rest of the transaction (two replays of one row serialize);
        each row's status and replay count once locked, which another operator may have
        changed since the rows were read."""
        locked = tx.execute(self._lock, (list(ids),))
        return {letter_id: (status, replays) for letter_id, status, replays in locked}

    def mark_replayed(self, tx: Tx, ids: Sequence[int]) -> None:
        if ids:
            tx.execute(self._mark_replayed, (list(ids),))

    def record_replay(
        self,
        tx: Tx,
        criteria: dict[str, Any],
        ids: Sequence[int],
        replayed: int,
        refused: int,
        result: str,
    ) -> int:
        row = tx.execute(
            self._record_replay, (Jsonb(criteria), list(ids), replayed, refused, result)
        ).fetchone()
        assert row is not None
        return int(row[0])

    def purge(self, tx: Tx, ids: Sequence[int]) -> int:
        """Mark letters purged (``saga db prune`` deletes them after the retention period)."""
        return tx.execute(self._purge, (list(ids),)).rowcount


def _row(values: list[Any]) -> DeadLetterRow:
    values[8] = bytes(values[8])  # body: bytea arrives as memoryview
    return DeadLetterRow(*values)
