"""The PostgreSQL broker's low-water marks: where a claim's index scan may start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from saga.broker.postgres.low_water import MARGIN, LowWaterMarks

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
AGO = NOW - timedelta(minutes=5)


def _claimed(marks: LowWaterMarks, queues: list[str], limit: int, taken: list[Any]) -> None:
    marks.advance(queues, marks.floors(queues), limit, taken, NOW)


def test_the_first_claim_of_a_channel_scans_every_queue_from_its_start() -> None:
    assert LowWaterMarks().floors(["a", "b"]).floors == [None, None]


def test_a_queue_starts_next_at_its_first_message_taken_less_the_margin() -> None:
    marks = LowWaterMarks()
    _claimed(marks, ["a"], 10, [("a", AGO + timedelta(seconds=3)), ("a", AGO)])
    assert marks.floors(["a"]).floors == [AGO - MARGIN]


def test_a_queue_with_nothing_taken_starts_next_at_now_less_the_margin() -> None:
    marks = LowWaterMarks()
    _claimed(marks, ["a", "b"], 10, [("a", AGO)])
    assert marks.floors(["a", "b"]).floors == [AGO - MARGIN, NOW - MARGIN]


def test_a_queue_the_limit_may_have_cut_off_keeps_its_floor() -> None:
    marks = LowWaterMarks()
    _claimed(marks, ["a", "b"], 10, [])
    _claimed(marks, ["a", "b"], 2, [("a", NOW), ("a", NOW)])
    assert marks.floors(["b"]).floors == [NOW - MARGIN]
    later = NOW + timedelta(minutes=1)
    marks.advance(["a", "b"], marks.floors(["a", "b"]), 2, [("a", later), ("a", later)], later)
    assert marks.floors(["b"]).floors == [NOW - MARGIN]


def test_every_full_scan_interval_a_claim_scans_from_the_start_again() -> None:
    marks = LowWaterMarks(full_scan_interval=0)
    _claimed(marks, ["a"], 10, [])
    assert marks.floors(["a"]).floors == [None]


def test_a_rescan_starts_at_the_lowest_floor_read_in_the_last_two_intervals() -> None:
    marks = LowWaterMarks(rescan_interval=3600)
    _claimed(marks, ["a"], 10, [("a", AGO)])  # the first, full scan
    _claimed(marks, ["a"], 10, [("a", AGO + timedelta(minutes=1))])  # read from AGO - MARGIN
    _claimed(marks, ["a"], 10, [])  # read from AGO + 1 min - MARGIN
    marks._next_rescan = 0.0  # the interval is over
    scan = marks.floors(["a"])
    assert scan.rescan and scan.floors == [AGO - MARGIN]
    marks.advance(["a"], scan, 10, [], NOW)  # the rescan
    _claimed(marks, ["a"], 10, [])  # read from NOW - MARGIN
    marks._next_rescan = 0.0
    assert marks.floors(["a"]).floors == [AGO - MARGIN]  # the interval before still counts
    marks.advance(["a"], marks.floors(["a"]), 10, [], NOW)
    marks._next_rescan = 0.0
    assert marks.floors(["a"]).floors == [NOW - MARGIN]
