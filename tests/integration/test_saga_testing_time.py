"""saga.testing's time that skips by itself: run_until_idle(skip_time=True)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from saga import Saga, SagaRegistry, Tx
from saga.messaging.control import Ack
from saga.testing import SagaHarness
from saga.testing.clock import EPOCH
from tests.integration.test_saga_testing import (
    Charge,
    HoldData,
    Reserve,
    Reserved,
    hold_registry,
)


class Nudge(BaseModel):
    note: str


class ReminderData(BaseModel):
    customer: str
    finished: bool = False


def reminders() -> tuple[SagaRegistry, Saga[ReminderData]]:
    """Three timers: remind after an hour, again after a day, close after five days."""
    reminder = Saga("reminder", data=ReminderData)
    reminder.wait("first", event="nudge", payload=Nudge, timeout=timedelta(hours=1),
                  on_timeout="second")  # fmt: skip
    reminder.wait("second", event="nudge", payload=Nudge, timeout=timedelta(days=1),
                  on_timeout="last")  # fmt: skip
    reminder.wait("last", event="nudge", payload=Nudge, timeout=timedelta(days=5),
                  on_timeout="close")  # fmt: skip

    @reminder.local("close")
    def close(tx: Tx, data: ReminderData) -> ReminderData:
        return data.model_copy(update={"finished": True})

    registry = SagaRegistry("reminders")
    registry.register(reminder)
    return registry, reminder


def test_three_timers_run_to_completion_in_one_call(saga_harness) -> None:
    registry, reminder = reminders()
    h: SagaHarness = saga_harness(registry)
    saga_id = h.start(reminder, ReminderData(customer="c1"))

    run = h.run_until_idle(skip_time=True)

    assert h.status(saga_id) == "completed"
    assert run.elapsed == timedelta(hours=1) + timedelta(days=1) + timedelta(days=5)
    assert [(e.step, e.finished_at - EPOCH) for e in h.timeline(saga_id)] == [
        ("first", timedelta(hours=1)),
        ("second", timedelta(days=1, hours=1)),
        ("last", timedelta(days=6, hours=1)),
        ("close", timedelta(days=6, hours=1)),
    ]


def test_time_stops_at_the_limit(saga_harness) -> None:
    registry, reminder = reminders()
    h: SagaHarness = saga_harness(registry)
    saga_id = h.start(reminder, ReminderData(customer="c1"))

    run = h.run_until_idle(skip_time=True, limit=timedelta(days=2))

    assert (h.status(saga_id), h.step(saga_id)) == ("running", "last")
    assert run.elapsed == timedelta(days=1, hours=1)
    assert [due - EPOCH for due, _ in h.scheduled] == [timedelta(days=6, hours=1)]


def test_time_stops_while_a_command_waits_for_the_tests_answer(saga_harness) -> None:
    registry, hold = hold_registry(deadline=timedelta(seconds=30))
    h: SagaHarness = saga_harness(registry)
    saga_id = h.start(hold, HoldData(order_id="o-1"))

    run = h.run_until_idle(skip_time=True)

    assert run.elapsed == timedelta(0)  # the deadline has not fired: the test answers first
    assert h.steps(saga_id) == []
    h.expect_command("vault", Reserve(order_id="o-1"))


def test_time_stops_once_the_sagas_have_settled(saga_harness) -> None:
    registry, hold = hold_registry(deadline=timedelta(days=1))
    h: SagaHarness = saga_harness(registry)
    h.on("vault", Reserve, Reserved(reservation_id="r-1"))
    h.on("bank", Charge, Ack())
    saga_id = h.start(hold, HoldData(order_id="o-1"))

    run = h.run_until_idle(skip_time=True)

    assert h.status(saga_id) == "completed"
    assert h.scheduled  # the deadlines of steps answered in time: nothing left to move
    assert run.elapsed == timedelta(0)
