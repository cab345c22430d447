"""Guarded side effects against a fake payment gateway that counts calls per key."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from saga.effects.side_effects import SideEffects
from saga.errors import LeaseLost, SideEffectFailed
from saga.examples.order_saga.gateway import GatewayClient, GatewayServer
from tests.support.databases import TestDatabase


@pytest.fixture
def gateway() -> Iterator[GatewayClient]:
    server = GatewayServer().start()
    yield GatewayClient(server.url)
    server.stop()


@pytest.fixture
def effects(db: TestDatabase) -> Iterator[SideEffects]:
    guard = SideEffects(db.url, lease=timedelta(seconds=2), poll=0.01)
    yield guard
    guard.close()


def test_twenty_concurrent_attempts_make_one_call_and_see_one_result(
    effects: SideEffects, gateway: GatewayClient
) -> None:
    key = "saga-1:charge_payment"
    results: list[Any] = []
    barrier = threading.Barrier(20)

    def slow_charge() -> Any:
        time.sleep(0.2)  # the external call takes a while: the others must wait for it
        return gateway.charge(key, 500, "tok_ok")

    def attempt() -> None:
        barrier.wait()
        results.append(effects.run(key, call=slow_charge))

    threads = [threading.Thread(target=attempt) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert gateway.calls() == {key: 1}
    assert len(results) == 20 and all(r == results[0] for r in results)
    assert results[0]["status"] == "succeeded"


def test_a_second_attempt_returns_the_recorded_result_without_calling(
    effects: SideEffects, gateway: GatewayClient, db: TestDatabase
) -> None:
    first = effects.run("k", call=lambda: gateway.charge("k", 100, "tok_ok"))
    again = effects.run("k", call=lambda: gateway.charge("k", 100, "tok_ok"))
    assert first == again and gateway.calls() == {"k": 1}
    assert db.scalar("SELECT state FROM saga.side_effects WHERE key = 'k'") == "succeeded"


def test_a_zombie_past_its_lease_is_taken_over_and_on_takeover_runs_first(
    effects: SideEffects, gateway: GatewayClient, db: TestDatabase
) -> None:
    gateway.charge("z", 300, "tok_ok")  # the dead worker's call did reach the gateway
    db.execute(
        "INSERT INTO saga.side_effects (key, state, owner, lease_until, attempts) "
        "VALUES ('z', 'in_progress', gen_random_uuid(), now() - interval '1 second', 1)"
    )
    order: list[str] = []

    def look_up() -> Any:
        order.append("on_takeover")
        return gateway.find_charge("z")

    def charge() -> Any:
        order.append("call")
        return gateway.charge("z", 300, "tok_ok")

    result = effects.run("z", call=charge, on_takeover=look_up)
    assert order == ["on_takeover"] and result["key"] == "z"
    assert gateway.calls() == {"z": 1}  # not charged again
    row = db.rows("SELECT state, takeovers, attempts FROM saga.side_effects WHERE key = 'z'")
    assert row == [("succeeded", 1, 2)]


def test_a_takeover_that_finds_nothing_makes_the_call(
    effects: SideEffects, gateway: GatewayClient, db: TestDatabase
) -> None:
    db.execute(
        "INSERT INTO saga.side_effects (key, state, owner, lease_until) "
        "VALUES ('n', 'in_progress', gen_random_uuid(), now() - interval '1 second')"
    )
    result = effects.run(
        "n", call=lambda: gateway.charge("n", 1, "tok_ok"), on_takeover=lambda: None
    )
    assert result["status"] == "succeeded" and gateway.calls() == {"n": 1}


def test_a_live_attempt_is_waited_for_not_taken_over(
    effects: SideEffects, gateway: GatewayClient, db: TestDatabase
) -> None:
    lease_until = db.scalar(
        "INSERT INTO saga.side_effects (key, state, owner, lease_until) "
        "VALUES ('w', 'in_progress', gen_random_uuid(), now() + interval '1 second') "
        "RETURNING lease_until"
    )
    called_at = []

    def charge() -> Any:
        called_at.append(db.scalar("SELECT clock_timestamp()"))  # the lease's clock
        return gateway.charge("w", 1, "tok_ok")

    result = effects.run("w", call=charge)
    assert called_at[0] >= lease_until  # waited for the lease to run out first
    assert result["status"] == "succeeded"


def test_failures_release_the_key_or_record_a_permanent_failure(
    effects: SideEffects, gateway: GatewayClient, db: TestDatabase
) -> None:
    with pytest.raises(ConnectionError):
        effects.run("t", call=lambda: (_ for _ in ()).throw(ConnectionError("timeout")))
    assert db.scalar("SELECT state FROM saga.side_effects WHERE key = 't'") == "pending"
    assert effects.run("t", call=lambda: {"ok": True}) == {"ok": True}  # a retry may call again

    class CardRejected(Exception):
        pass

    def reject() -> Any:
        raise CardRejected("stolen card")

    with pytest.raises(CardRejected):
        effects.run("p", call=reject, permanent=(CardRejected,))
    with pytest.raises(SideEffectFailed, match="stolen card"):
        effects.run("p", call=lambda: {"ok": True})


def test_a_call_that_outlives_its_lease_is_told_so(
    db: TestDatabase, gateway: GatewayClient
) -> None:
    short = SideEffects(db.url, lease=timedelta(milliseconds=200), poll=0.01)
    try:

        def slow() -> Any:
            # while we are slow, another attempt waits out our lease and takes the key over
            other = SideEffects(db.url, lease=timedelta(seconds=5), poll=0.01)
            try:
                other.run("slow", call=lambda: {"by": "other"}, on_takeover=lambda: None)
            finally:
                other.close()
            return {"by": "first"}

        with pytest.raises(LeaseLost):
            short.run("slow", call=slow)
    finally:
        short.close()
    assert db.scalar("SELECT result->>'by' FROM saga.side_effects WHERE key = 'slow'") == "other"
