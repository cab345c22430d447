"""Resuming sagas: one by id, or every stuck one at once (``saga resume``).

A resume is a :class:`~saga.messaging.control.ResumeSaga` message to the saga's home
service, written to the outbox in the operator's transaction. The orchestrator
then tries again what stopped the saga; a saga stuck waiting on a reply gets
its pending command sent again under the same message id, so a participant
that did handle it does not handle it twice but answers it again with the reply
it sent then (its reply may be what was lost), and one that never saw it
handles it now. Bulk resume is how an operator recovers sagas
whose messages a broker lost (a Redis restart without persistence).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg

from saga.db.sql import Tx, render
from saga.engine.store import SagaStore
from saga.errors import NotResumable, UnknownSaga
from saga.messaging.control import ResumeSaga
from saga.messaging.dead_letters import DeadLetterFilter, DeadLetterStore
from saga.messaging.outbox import Outbox

# Running or compensating with no progress for a while; a saga waiting for an event
# (``waiting_for``) is not stuck: it needs a signal, not a resume.
_STUCK = """
SELECT id, name, status, step, service, updated_at FROM {schema}.saga_instances
WHERE status IN ('running', 'compensating') AND waiting_for IS NULL
  AND updated_at < now() - %(stuck)s::interval
  AND (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(service)s::text IS NULL OR service = %(service)s)
  AND (%(older)s::interval IS NULL OR started_at < now() - %(older)s::interval)
  AND (%(newer)s::interval IS NULL OR started_at >= now() - %(newer)s::interval)
ORDER BY updated_at, id
LIMIT %(limit)s
"""

#: Resumes written per transaction by :meth:`SagaResumer.resume_stuck`.
BATCH = 200


@dataclass(frozen=True, slots=True)
class StuckFilter:
    """Which stuck sagas a bulk resume takes."""

    stuck_after: timedelta
    name: str | None = None
    #: Only sagas started more than this long ago.
    older_than: timedelta | None = None
    #: Only sagas started within this long.
    newer_than: timedelta | None = None
    limit: int | None = None
    #: Only sagas whose home is this service.
    service: str | None = None


@dataclass(frozen=True, slots=True)
class StuckSaga:
    id: UUID
    name: str
    status: str
    step: str | None
    service: str
    updated_at: datetime


class SagaResumer:
    """Writes resume messages for sagas in one schema, on connections the caller manages."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.store = SagaStore(schema)
        self.outbox = Outbox(schema)
        self._stuck = render(_STUCK, schema)

    def resume(self, tx: Tx, saga_id: UUID, *, stuck_after: timedelta, reason: str) -> str:
        """Resume one saga (in the caller's transaction); return its home service.

        A saga that failed to compensate or failed after its pivot is always resumable;
        a running or compensating one only when it made no progress for ``stuck_after``.
        """
        record = self.store.load(tx, saga_id)
        if record is None:
            raise UnknownSaga(f"no saga {saga_id} in schema {self.schema!r}")
        if record.status.finished:
            raise NotResumable(f"saga {saga_id} is {record.status.value}; nothing to resume")
        if not record.status.needs_operator:
            idle = datetime.now(UTC) - (record.updated_at or datetime.now(UTC))
            if idle < stuck_after:
                raise NotResumable(
                    f"saga {saga_id} is {record.status.value} and progressed "
                    f"{idle.total_seconds():.0f}s ago; it is not stuck "
                    f"(use --stuck-after to lower the threshold)"
                )
        self._send(tx, saga_id, record.service, reason)
        return record.service

    def find_stuck(self, tx: Tx, which: StuckFilter) -> list[StuckSaga]:
        """The stuck sagas ``which`` selects, longest idle first."""
        rows = tx.execute(
            self._stuck,
            {
                "stuck": which.stuck_after,
                "name": which.name,
                "older": which.older_than,
                "newer": which.newer_than,
                "limit": which.limit,
                "service": which.service,
            },
        ).fetchall()
        return [StuckSaga(*row) for row in rows]

    def resume_stuck(
        self,
        conn: psycopg.Connection[Any],
        stuck: list[StuckSaga],
        *,
        reason: str,
        progress: Callable[[int], None] | None = None,
        message_id: Callable[[StuckSaga], UUID] | None = None,
    ) -> int:
        """Resume each of ``stuck``, :data:`BATCH` per transaction; return how many.

        ``progress`` is called with the number resumed after each committed batch.
        ``message_id`` gives each resume its message id (a new one each by default).
        """
        for start in range(0, len(stuck), BATCH):
            batch = stuck[start : start + BATCH]
            with conn.transaction():
                for saga in batch:
                    the_id = message_id(saga) if message_id is not None else None
                    self._send(conn, saga.id, saga.service, reason, the_id)
            if progress is not None:
                progress(len(batch))
        return len(stuck)

    def _send(
        self,
        tx: Tx,
        saga_id: UUID,
        service: str,
        reason: str,
        message_id: UUID | None = None,
    ) -> None:
        self.outbox.add(
            tx,
            ResumeSaga(saga_id=saga_id, reason=reason),
            destination=service,
            saga_id=saga_id,
            message_id=message_id,
        )
        self._close_dead_letters(tx, saga_id)

    def _close_dead_letters(self, tx: Tx, saga_id: UUID) -> None:
        """Resuming answers the saga's own dead letters: mark them replayed, and record it."""
        store = DeadLetterStore(self.schema)
        letters = [
            letter
            for letter in store.find(tx, DeadLetterFilter(status="pending", saga_id=saga_id))
            if letter.error_type in ("CompensationFailed", "ForwardStepFailed")
        ]
        if letters:
            ids = [letter.id for letter in letters]
            store.mark_replayed(tx, ids)
            store.record_replay(
                tx,
                {"command": "saga resume", "saga_id": str(saga_id)},
                ids,
                len(ids),
                0,
                "resumed",
            )
