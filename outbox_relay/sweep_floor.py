"""Where the relay's sweep of ready outbox rows starts: past the rows already gone.

Every published row leaves a dead entry in the ``outbox_ready`` index. Vacuum reclaims
them, unless a transaction anywhere on the database holds a snapshot older than they
are: a sweep that walked the index from its start would then visit every row published
since that snapshot began, on every poll, and its cost would grow with the history.

So the sweep reads ``id >= floor``. After each sweep the relay notes the first ready id
it found (or, finding none, the next id the sequence will give); the floor is the last
such note at least :data:`LAG` seconds old. A row whose transaction took its id earlier
and committed later (the late commit that an ``id > last_seen`` cursor loses) is still
at or past the floor unless it committed more than :data:`LAG` seconds late; that one,
and a scheduled row made ready again under its old id, is found by a full sweep: every
:data:`RESCAN_INTERVAL`, after every promotion of due rows, and on the relay's first.
"""

from __future__ import annotations

from collections import deque
from time import monotonic

#: Seconds a sweep's note waits before it becomes the floor: longer than a writer's
#: transaction takes between taking an id and committing.
LAG = 5.0
#: Seconds between full sweeps, which find what committed later than LAG.
RESCAN_INTERVAL = 30.0


class SweepFloor:
    """The floor of one relay's sweeps, in memory."""

    def __init__(self, lag: float = LAG, rescan_interval: float = RESCAN_INTERVAL) -> None:
        self._lag = lag
        self._rescan_interval = rescan_interval
        self._notes: deque[tuple[float, int]] = deque()
        self._floor = 0
        self._next_rescan = 0.0

    def floor(self) -> int:
        """The lowest id the next sweep reads (0: the whole index)."""
        return 0 if monotonic() >= self._next_rescan else self._floor

    def swept(self, floor: int, first_ready: int) -> None:
        """A sweep from ``floor`` found ``first_ready`` as its first ready id (or the next
        id to come, when it found none)."""
        now = monotonic()
        if floor == 0:
            self._next_rescan = now + self._rescan_interval
        self._notes.append((now, first_ready))
        while self._notes and self._notes[0][0] <= now - self._lag:
            _, self._floor = self._notes.popleft()

    def noted_within(self, seconds: float) -> bool:
        """Whether a sweep was noted in the last ``seconds``."""
        return bool(self._notes) and monotonic() - self._notes[-1][0] < seconds

    def rescan(self) -> None:
        """Sweep the whole index next (rows made ready again keep their old ids)."""
        self._next_rescan = 0.0
