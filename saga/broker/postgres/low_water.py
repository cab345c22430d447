"""Per-queue low-water marks: where a channel's next claim starts its index scan.

A consumed message leaves dead entries in the ``(queue, visible_at, id)`` index (its
lease and its delete). Vacuum reclaims them, unless a transaction anywhere on the
database holds a snapshot older than they are (a report, a ``pg_dump``, a psql window
left ``idle in transaction``): then every claim that walks the queue from its start
visits the heap row of every message consumed since that snapshot began, and the
claim's cost grows with the history instead of the backlog.

A claim reads ``visible_at >= floor``: the floor is the key of the first message the
last claim found free (everything before it was consumed, or taken by another claim
whose lease moves the row ahead), less :data:`MARGIN` for a publisher's insert that
committed after the claim though stamped before it. What a floor can still pass by (a
claim that rolled back, a message cut by another consumer's limit, an insert later than
the margin) is found by a full scan every :data:`RESCAN_INTERVAL`, and by every new
channel, whose first claim is a full scan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from time import monotonic

#: How far behind the first free message the next scan starts: a publisher's insert
#: statement stamps ``visible_at`` when it starts and is seen when it commits.
MARGIN = timedelta(seconds=0.5)
#: Seconds between full scans, which find what the floors passed by.
RESCAN_INTERVAL = 30.0


class LowWaterMarks:
    """The floors of one channel's queues, in memory."""

    def __init__(self, rescan_interval: float = RESCAN_INTERVAL) -> None:
        self._floors: dict[str, datetime] = {}
        self._rescan_interval = rescan_interval
        self._next_rescan = 0.0  # the first claim scans everything

    def floors(self, queues: Sequence[str]) -> list[datetime | None]:
        """Where the next claim of each queue starts (None: from the queue's start)."""
        if monotonic() >= self._next_rescan:
            return [None] * len(queues)
        return [self._floors.get(queue) for queue in queues]

    def advance(
        self,
        queues: Sequence[str],
        floors: Sequence[datetime | None],
        limit: int,
        taken: Iterable[tuple[str, datetime]],
        now: datetime,
    ) -> None:
        """Move the floors after a claim that read from ``floors``, took ``taken`` (each
        message's queue and the ``visible_at`` it had) and ran at the database's ``now``.

        A queue with messages taken starts next at the first of them; a queue with none
        taken starts at ``now``, unless the claim took ``limit`` messages (the limit may
        have cut that queue's messages off)."""
        if all(floor is None for floor in floors):
            self._next_rescan = monotonic() + self._rescan_interval
        first: dict[str, datetime] = {}
        count = 0
        for queue, visible_at in taken:
            count += 1
            if queue not in first or visible_at < first[queue]:
                first[queue] = visible_at
        for queue in queues:
            mark = first.get(queue, now if count < limit else None)
            if mark is not None:
                self._floors[queue] = min(mark, now) - MARGIN
