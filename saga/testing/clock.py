"""A clock that moves only when the test says so."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

#: Where every harness's virtual time starts (a fixed instant: timelines read the same each run).
EPOCH = datetime(2030, 1, 1, tzinfo=UTC)


class VirtualClock:
    """``now()`` for the sagas under test; :meth:`SagaHarness.advance` moves it forward."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self._now = start

    def __repr__(self) -> str:
        return f"VirtualClock({self._now.isoformat()})"

    def now(self) -> datetime:
        return self._now

    def move_to(self, moment: datetime) -> None:
        """Set the time to ``moment``; time never runs backwards."""
        if moment < self._now:
            raise ValueError(f"the clock cannot go back from {self._now} to {moment}")
        self._now = moment

    def elapsed_since(self, start: datetime = EPOCH) -> timedelta:
        return self._now - start
