"""The group timeline's segments (bench/group_timeline.py): they tile the step, and a
group reaches each milestone when its last member does."""

import pytest

from bench.group_timeline import SEGMENTS, Milestones, Timeline, medians


def test_the_segments_of_a_step_add_up_to_it() -> None:
    step = Milestones(10.000, 10.002, 10.005, 10.007, 10.010, 10.012)
    segments = step.segments_ms()
    assert len(segments) == len(SEGMENTS)
    assert segments == pytest.approx((2, 3, 2, 3, 2))
    assert sum(segments) == pytest.approx(12)


def test_a_group_waits_for_its_slowest_member_at_every_milestone() -> None:
    stock = Milestones(10.000, 10.002, 10.004, 10.006, 10.009, 10.011)
    credit = Milestones(10.000, 10.002, 10.005, 10.008, 10.009, 10.011)
    group = Milestones.of_group([stock, credit])
    assert group.segments_ms() == pytest.approx((2, 3, 3, 1, 2))
    assert medians([group]) == pytest.approx([2, 3, 3, 1, 2, 11])


def test_the_floor_counts_what_v1_saves_without_its_credit_step() -> None:
    # the credit step's first segment is the stock reply's transaction: v1 keeps it
    timeline = Timeline([2, 3, 2, 3, 2, 12], [2, 2, 2, 2, 2, 10], [2, 4, 3, 3, 2, 14], 40, 36)
    ratio, floor = timeline.rows()[-1][1:]
    assert "a ratio of 0.900" in ratio
    assert floor.startswith("0.800 ")
