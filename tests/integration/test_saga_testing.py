"""saga.testing itself: the virtual clock, stubs, payload mismatches, fail-fast, faults."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from pydantic import BaseModel

from saga import HandlerContext, Outbox, RetryPolicy, Saga, SagaRegistry, Service, Tx
from saga.testing import PayloadMismatch, SagaHarness, VirtualClock
from saga.testing.clock import EPOCH
from tests.support import loans
from tests.support.services import EFFECTS_DDL


class Ping(BaseModel):
    n: int


class Reserve(BaseModel):
    order_id: str


class Reserved(BaseModel):
    reservation_id: str


class Release(BaseModel):
    reservation_id: str


class Charge(BaseModel):
    order_id: str


class HoldData(BaseModel):
    order_id: str
    reservation_id: str | None = None


def hold_registry(
    release: type[BaseModel] = Release, deadline: timedelta | None = None
) -> tuple[SagaRegistry, Saga[HoldData]]:
    """Reserve at the vault (sent again at each ``deadline``), then charge at the bank; a
    refused charge releases the hold.

    The compensation has a planted bug: it releases the order id, not the reservation's."""
    hold = Saga("hold", data=HoldData)
    hold.remote(
        "reserve",
        service="vault",
        command=lambda d: Reserve(order_id=d.order_id),
        reply=Reserved,
        on_reply=lambda d, r: d.model_copy(update={"reservation_id": r.reservation_id}),
        compensate=lambda d: release(reservation_id=d.order_id),  # the bug
        deadline=deadline,
    )
    hold.remote("charge", service="bank", command=lambda d: Charge(order_id=d.order_id))
    registry = SagaRegistry("holds")
    registry.register(hold)
    return registry, hold


def test_a_wait_of_days_and_its_timeout_take_no_wall_time(saga_harness, monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)  # nothing may wait on the real clock
    h: SagaHarness = saga_harness(loans.registry_v1, services=[loans.bureau], schema=[EFFECTS_DDL])
    saga_id = h.start("loan", loans.LoanData(loan_id="l1"))
    h.run_until_idle()
    assert (h.status(saga_id), h.step(saga_id)) == ("running", "wait_approval")

    h.advance(timedelta(days=4, hours=23))
    assert h.step(saga_id) == "wait_approval"
    h.advance(timedelta(hours=1))

    assert h.status(saga_id) == "compensated"
    timed_out = next(e for e in h.timeline(saga_id) if e.outcome == "timed_out")
    assert timed_out.finished_at == EPOCH + timedelta(days=5)  # virtual time in the step log
    assert h.rows("SELECT kind FROM effects ORDER BY id") == [("request",), ("cancel",)]
    assert slept == []


def test_a_signal_in_time_moves_on_and_its_timeout_is_ignored(saga_harness) -> None:
    h: SagaHarness = saga_harness(loans.registry_v1, services=[loans.bureau], schema=[EFFECTS_DDL])
    saga_id = h.start("loan", loans.LoanData(loan_id="l1"))
    h.advance(timedelta(days=2))
    h.signal(saga_id, "approval", loans.Approval(approver="ann"))
    h.advance(timedelta(days=10))

    assert (h.status(saga_id), h.step(saga_id)) == ("running", "wait_signature")
    assert h.data(saga_id) == loans.LoanData(loan_id="l1", score=700, approver="ann")


def test_delayed_messages_fire_in_order_when_their_virtual_time_comes(saga_harness) -> None:
    seen: list[tuple[int, object]] = []
    clock = VirtualClock()
    pings = Service("pings")

    @pings.handler(Ping)
    def ping(tx: Tx, msg: Ping, ctx: HandlerContext) -> None:
        seen.append((msg.n, clock.now() - EPOCH))

    h: SagaHarness = saga_harness(services=[pings], clock=clock)
    outbox = Outbox()
    with h.transaction() as tx:
        outbox.add(tx, Ping(n=2), destination="pings", deliver_after=timedelta(hours=2))
        outbox.add(tx, Ping(n=1), destination="pings", deliver_after=timedelta(hours=1))
    h.advance(timedelta(hours=3))
    assert seen == [(1, timedelta(hours=1)), (2, timedelta(hours=2))]

    with h.transaction() as tx:  # written at virtual 3 h: due at 4 h, not at once
        outbox.add(tx, Ping(n=3), destination="pings", deliver_after=timedelta(hours=1))
    h.advance(timedelta(minutes=59))
    assert len(seen) == 2
    h.advance(timedelta(minutes=1))
    assert seen[-1] == (3, timedelta(hours=4))


def test_a_wrong_compensation_payload_shows_both_side_by_side(saga_harness) -> None:
    registry, hold = hold_registry()
    h: SagaHarness = saga_harness(registry)
    h.on("vault", Reserve, Reserved(reservation_id="r-1"))
    h.start(hold, HoldData(order_id="o-1"))
    h.expect_command("bank", Charge(order_id="o-1")).fail("card declined")
    h.run_until_idle()

    with pytest.raises(PayloadMismatch) as raised:
        h.assert_sent("vault", Reserve(order_id="o-1"), Release(reservation_id="r-1"))
    text = str(raised.value)
    assert "messages sent to vault #2 differs" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("reservation_id"))
    assert '"r-1"' in row and '"o-1"' in row and "differs" in row


def test_expecting_a_command_checks_its_whole_payload(saga_harness) -> None:
    registry, hold = hold_registry()
    h: SagaHarness = saga_harness(registry)
    h.start(hold, HoldData(order_id="o-1"))
    with pytest.raises(PayloadMismatch, match="o-1"):
        h.expect_command("vault", Reserve(order_id="o-2"))


def test_a_handler_error_fails_the_test_at_once_unless_asked(saga_harness) -> None:
    vault = Service("vault", retry=RetryPolicy(delays=(5.0,), delay_jitter=0))
    calls: list[str] = []

    @vault.handler(Reserve)
    def reserve(tx: Tx, cmd: Reserve, ctx: HandlerContext) -> Reserved:
        calls.append(cmd.order_id)
        raise ValueError("bug in reserve")

    @vault.handler(Release)
    def release(tx: Tx, cmd: Release, ctx: HandlerContext) -> None:
        pass

    registry, hold = hold_registry()
    h: SagaHarness = saga_harness(registry, services=[vault])
    h.start(hold, HoldData(order_id="o-1"))
    with pytest.raises(ValueError, match="bug in reserve") as raised:
        h.run_until_idle()
    assert "fails fast" in "".join(raised.value.__notes__)

    relaxed: SagaHarness = saga_harness(registry, services=[vault], fail_fast=False)
    calls.clear()
    saga_id = relaxed.start(hold, HoldData(order_id="o-1"))
    relaxed.advance(timedelta(seconds=5))
    assert len(calls) == 6  # 3 tries, then 3 more after the delayed retry: a dead letter
    assert relaxed.rows("SELECT reason FROM saga.dead_letters") == [("failed",)]
    assert relaxed.status(saga_id) == "compensated"


def test_a_redelivered_command_has_its_effect_once(saga_harness) -> None:
    vault = Service("vault")
    reserved: list[str] = []

    @vault.handler(Reserve)
    def reserve(tx: Tx, cmd: Reserve, ctx: HandlerContext) -> Reserved:
        reserved.append(cmd.order_id)
        return Reserved(reservation_id="r-1")

    registry, hold = hold_registry()
    h: SagaHarness = saga_harness(registry, services=[vault])
    saga_id = h.start(hold, HoldData(order_id="o-1"))
    h.expect_command("bank", Charge)
    (command,) = h.sent_to("vault")
    h.redeliver(command)
    h.run_until_idle()

    assert reserved == ["o-1"]
    assert (h.status(saga_id), h.step(saga_id)) == ("running", "charge")


def vault_harness(saga_harness, registry: SagaRegistry) -> tuple[SagaHarness, list[str]]:
    """A harness with a real vault, and the orders the vault reserved."""
    reserved: list[str] = []
    vault = Service("vault")

    @vault.handler(Reserve)
    def reserve(tx: Tx, cmd: Reserve, ctx: HandlerContext) -> Reserved:
        reserved.append(cmd.order_id)
        return Reserved(reservation_id="r-" + cmd.order_id)

    return saga_harness(registry, services=[vault]), reserved


def test_a_crash_after_commit_redelivers_and_the_reply_comes_twice(saga_harness) -> None:
    registry, hold = hold_registry()
    h, reserved = vault_harness(saga_harness, registry)
    h.crash_after_commit("vault", Reserve)
    saga_id = h.start(hold, HoldData(order_id="o-1"))
    h.expect_command("bank", Charge(order_id="o-1"))

    assert reserved == ["o-1"]  # handled once, delivered twice
    assert [c.outcome.value for c in h.consumed if c.service == "vault"] == ["handled", "duplicate"]
    h.assert_sent("holds", Reserved(reservation_id="r-o-1"), Reserved(reservation_id="r-o-1"))
    assert [c.outcome.value for c in h.consumed if c.service == "holds"] == ["handled", "duplicate"]
    assert (h.status(saga_id), h.step(saga_id)) == ("running", "charge")


def test_a_command_held_back_is_overtaken_by_the_next_one(saga_harness) -> None:
    registry, hold = hold_registry()
    h, reserved = vault_harness(saga_harness, registry)
    h.hold("vault", Reserve)
    first = h.start(hold, HoldData(order_id="o-1"))
    second = h.start(hold, HoldData(order_id="o-2"))
    h.run_until_idle()
    assert reserved == ["o-2"]
    assert (h.step(first), h.step(second)) == ("reserve", "charge")

    assert h.release("vault") == 1
    assert reserved == ["o-2", "o-1"]
    assert h.step(first) == "charge"


def test_a_command_retried_past_its_deadline_overtakes_the_held_original(saga_harness) -> None:
    registry, hold = hold_registry(deadline=timedelta(seconds=30))
    h, reserved = vault_harness(saga_harness, registry)
    h.hold("vault", Reserve)
    saga_id = h.start(hold, HoldData(order_id="o-1"))
    h.advance(timedelta(seconds=30))
    assert h.steps(saga_id) == ["reserve deadline_exceeded", "reserve succeeded"]

    h.release("vault", Reserve)  # the original comes last: the same message, a duplicate
    assert reserved == ["o-1"]
    assert [c.outcome.value for c in h.consumed if c.service == "vault"] == ["handled", "duplicate"]
    assert (h.status(saga_id), h.step(saga_id)) == ("running", "charge")


def test_hold_and_crash_after_commit_pick_the_nth_message(saga_harness) -> None:
    seen: list[int] = []
    pings = Service("pings")

    @pings.handler(Ping)
    def ping(tx: Tx, msg: Ping, ctx: HandlerContext) -> None:
        seen.append(msg.n)

    h: SagaHarness = saga_harness(services=[pings])
    h.hold("pings", Ping, nth=2)
    h.crash_after_commit("pings", Ping, nth=3)
    with h.transaction() as tx:
        for n in (1, 2, 3):
            Outbox().add(tx, Ping(n=n), destination="pings")
    h.run_until_idle()
    assert [m.payload["n"] for m in h.held] == [2]

    h.release("pings", Ping)
    assert seen == [1, 3, 2]  # the third handled once though delivered twice; the second last
    assert [c.message.payload["n"] for c in h.consumed] == [1, 3, 3, 2]
