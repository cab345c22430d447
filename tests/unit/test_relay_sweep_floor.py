"""The relay's sweep floor: where a sweep of ready outbox rows may start."""

from __future__ import annotations

from saga.outbox_relay.sweep_floor import SweepFloor


def test_the_first_sweep_reads_the_whole_index() -> None:
    assert SweepFloor().floor() == 0


def test_a_note_becomes_the_floor_only_once_it_is_older_than_the_lag() -> None:
    slow = SweepFloor(lag=3600)
    slow.swept(0, 500)
    assert slow.floor() == 0  # a writer may still commit a row below 500
    quick = SweepFloor(lag=0)
    quick.swept(0, 500)
    assert quick.floor() == 500


def test_a_promotion_makes_the_next_sweep_read_the_whole_index() -> None:
    floor = SweepFloor(lag=0)
    floor.swept(0, 500)
    floor.rescan()
    assert floor.floor() == 0
    floor.swept(0, 700)
    assert floor.floor() == 700


def test_every_rescan_interval_a_sweep_reads_the_whole_index() -> None:
    floor = SweepFloor(lag=0, rescan_interval=0)
    floor.swept(0, 500)
    assert floor.floor() == 0
