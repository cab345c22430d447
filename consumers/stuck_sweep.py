"""Resuming a home service's stuck sagas without an operator (``--resume-stuck-after``).

A saga waiting on a reply that never comes, because a broker lost the command or the
reply, stays at its step until something sends again. With ``resume_stuck_after`` set,
the consumer of the sagas' home service looks every :meth:`StuckSweep.interval` for its
sagas running or compensating with no progress for that long, and resumes them as
``saga resume --stuck-after`` would: the pending command goes out again under its
original message id, so a participant that handled it answers again with its first
reply, and one that never saw it handles it now (:mod:`saga.operations.resume`).

Consumers of the same service in several threads or processes do not resume a saga
twice for the same stall: a sweep runs under a transaction-level advisory lock, and a
resume's message id is derived from the saga and the time of its last progress, so two
sweeps that saw the same stall write the same message and the saga's inbox takes it once.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg

from saga.operations.resume import BATCH, SagaResumer, StuckFilter, StuckSaga

logger = logging.getLogger(__name__)

#: The namespace of the resume message ids a sweep derives (:func:`resume_message_id`).
RESUME_NAMESPACE = uuid.UUID("5f0d7c2e-3b1a-4e57-9a4c-2d6f1e8b7a90")


def resume_message_id(saga: StuckSaga) -> uuid.UUID:
    """The same id for every sweep that finds ``saga`` stalled since the same moment."""
    return uuid.uuid5(RESUME_NAMESPACE, f"{saga.id}/{saga.updated_at.isoformat()}")


class StuckSweep:
    """Finds and resumes the stuck sagas of one home service, now and then."""

    def __init__(self, schema: str, service: str, stuck_after: timedelta) -> None:
        if stuck_after <= timedelta(0):
            raise ValueError(f"resume_stuck_after must be positive, not {stuck_after}")
        self.service = service
        self.stuck_after = stuck_after
        self.resumer = SagaResumer(schema)
        self._lock_key = f"{schema}.resume-stuck.{service}"
        self._next = time.monotonic() + self.interval
        self.resumed_total = 0

    @property
    def interval(self) -> float:
        """Seconds between sweeps: a quarter of the threshold, from 1 s to 60 s."""
        return min(max(self.stuck_after.total_seconds() / 4, 1.0), 60.0)

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def sweep(self, db: psycopg.Connection[Any]) -> int:
        """Resume up to :data:`BATCH` stuck sagas in one transaction; return how many."""
        self._next = time.monotonic() + self.interval
        with db.transaction():
            locked = db.execute(
                "SELECT pg_try_advisory_xact_lock(hashtext(%s))", (self._lock_key,)
            ).fetchone()
            if not (locked and locked[0]):
                return 0  # another consumer of this service is sweeping
            which = StuckFilter(self.stuck_after, service=self.service, limit=BATCH)
            stuck = self.resumer.find_stuck(db, which)
            if stuck:
                self.resumer.resume_stuck(
                    db,
                    stuck,
                    reason=f"resumed automatically: no progress for {self.stuck_after}",
                    message_id=resume_message_id,
                )
        if stuck:
            self.resumed_total += len(stuck)
            logger.warning(
                "resumed %d stuck saga(s) of %s (no progress for %s): %s",
                len(stuck),
                self.service,
                self.stuck_after,
                ", ".join(f"{s.id} at {s.step}" for s in stuck[:10]),
                extra={"consumer": self.service, "resumed": len(stuck)},
            )
        return len(stuck)
