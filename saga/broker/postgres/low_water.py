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
the margin) is found by a rescan every :data:`RESCAN_INTERVAL`. A message passed by
was at or past the floor its claim read from, so a rescan starts at the lowest floor the
claims of the last two intervals read from, not at the queue's start (which, while a
snapshot is held, would walk the whole history). What even that misses (an insert that
committed over an interval late) is found by a full scan every
:data:`FULL_SCAN_INTERVAL`, and by every new channel, whose first claim is a full scan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from time import monotonic

#: How far behind the first free message the next scan starts: a publisher's insert
#: statement stamps ``visible_at`` when it starts and is seen when it commits.
MARGIN = timedelta(seconds=0.5)
#: Seconds between rescans, which find what the floors passed by.
RESCAN_INTERVAL = 30.0
#: Seconds between scans from each queue's start.
FULL_SCAN_INTERVAL = 600.0


@dataclass(frozen=True, slots=True)
class Scan:
    """Where a claim reads each queue from (None: the queue's start), and whether it is
    a rescan (which the floors do not learn from)."""

    floors: list[datetime | None]
    rescan: bool


class LowWaterMarks:
    """The floors of one channel's queues, in memory."""

    def __init__(
        self,
        rescan_interval: float = RESCAN_INTERVAL,
        full_scan_interval: float = FULL_SCAN_INTERVAL,
    ) -> None:
        self._floors: dict[str, datetime] = {}
        self._lowest: dict[str, datetime] = {}  # read from since the last rescan
        self._previous: dict[str, datetime] = {}  # read from in the interval before
        self._rescan_interval = rescan_interval
        self._full_scan_interval = full_scan_interval
        self._next_rescan = 0.0
        self._next_full_scan = 0.0  # the first claim scans everything

    def floors(self, queues: Sequence[str]) -> Scan:
        """Where the next claim of each queue starts."""
        now = monotonic()
        if now >= self._next_full_scan:
            return Scan([None] * len(queues), rescan=True)
        if now >= self._next_rescan:
            return Scan([self._rescan_start(queue) for queue in queues], rescan=True)
        return Scan([self._floors.get(queue) for queue in queues], rescan=False)

    def _rescan_start(self, queue: str) -> datetime | None:
        starts = [marks[queue] for marks in (self._lowest, self._previous) if queue in marks]
        return min(starts) if starts else None

    def advance(
        self,
        queues: Sequence[str],
        scan: Scan,
        limit: int,
        taken: Iterable[tuple[str, datetime]],
        now: datetime,
    ) -> None:
        """Move the floors after a claim that read as ``scan`` says, took ``taken`` (each
        message's queue and the ``visible_at`` it had) and ran at the database's ``now``.

        A queue with messages taken starts next at the first of them; a queue with none
        taken starts at ``now``, unless the claim took ``limit`` messages (the limit may
        have cut that queue's messages off)."""
        if scan.rescan:
            clock = monotonic()
            self._next_rescan = clock + self._rescan_interval
            if all(floor is None for floor in scan.floors):
                self._next_full_scan = clock + self._full_scan_interval
            self._previous, self._lowest = self._lowest, {}
        else:
            for queue, floor in zip(queues, scan.floors, strict=True):
                if floor is not None and (queue not in self._lowest or floor < self._lowest[queue]):
                    self._lowest[queue] = floor
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
