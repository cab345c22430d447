"""The parallel group's share of the order saga, as ``make bench`` reports it."""

from __future__ import annotations

import pytest

from bench.run import GroupCost


def test_the_floor_is_the_sequential_saga_without_its_credit_step() -> None:
    cost = GroupCost(group_ms=12.0, stock_ms=10.0, credit_ms=8.0, sequential_ms=40.0)
    assert cost.floor == pytest.approx(0.8)


def test_the_allowance_is_what_the_group_saves_less_what_the_ratio_gives_up() -> None:
    cost = GroupCost(group_ms=12.0, stock_ms=10.0, credit_ms=9.0, sequential_ms=40.0)
    assert cost.allowance(0.8) == pytest.approx(1.0)
    # a group that costs exactly its allowance over the stock step meets the ratio
    parallel = cost.sequential_ms - cost.credit_ms + cost.allowance(0.8)
    assert parallel / cost.sequential_ms == pytest.approx(0.8)
