"""A parallel group on real PostgreSQL, over RabbitMQ and the PostgreSQL broker: members
answered in whatever order the participants manage, the saga completing when all have, and
a failed member compensating what its siblings and the steps before did, once each, and a
member answering after that compensated too, its compensation retried until it succeeds."""

from __future__ import annotations

import json
from collections import Counter
from uuid import UUID

import pytest
from pydantic import BaseModel

from saga import (
    HandlerContext,
    RetryPolicy,
    Saga,
    SagaRegistry,
    Service,
    StepFailed,
    StepRetry,
    Tx,
)
from saga.engine.state import waiting_on
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.instances import settled, start
from tests.support.running import saga_system_running
from tests.support.services import EFFECTS_DDL, record_effect
from tests.support.wait import wait_until


class Order(BaseModel):
    order_id: str
    credit_fails: bool = False
    credit_breaks: bool = False
    stock_late: bool = False  # the stock reservation answers once the saga compensated
    release_refusals: int = 0  # how many times the stock's release is refused first
    stock_ref: str | None = None


class ReserveStock(BaseModel):
    order_id: str
    stock_late: bool = False


class StockReserved(BaseModel):
    reference: str


class ReleaseStock(BaseModel):
    order_id: str
    release_refusals: int = 0


class ReserveCredit(BaseModel):
    order_id: str
    credit_fails: bool
    credit_breaks: bool = False


class ReleaseCredit(BaseModel):
    order_id: str


class Confirm(BaseModel):
    order_id: str


order = Saga("parallel_order", data=Order)


@order.local("open", compensate="close")
def open_order(tx: Tx, d: Order) -> None:
    record_effect(tx, "open", d.order_id)


@order.local_compensation("close")
def close_order(tx: Tx, d: Order) -> None:
    record_effect(tx, "close", d.order_id)


with order.parallel("reserve"):
    order.remote(
        "reserve_stock",
        service="stores",
        command=ReserveStock,
        reply=StockReserved,
        on_reply=lambda d, r: d.model_copy(update={"stock_ref": r.reference}),
        compensate=ReleaseStock,
        retry=StepRetry(attempts=2, initial_delay=0.2),  # its release: tried twice, 0.2 s apart
    )
    order.remote(
        "reserve_credit", service="stores", command=ReserveCredit, compensate=ReleaseCredit
    )

    @order.local("note")
    def note(tx: Tx, d: Order) -> None:
        record_effect(tx, "note", d.order_id)


order.remote("confirm", service="stores", command=Confirm)

FAST = RetryPolicy(immediate_attempts=2, immediate_initial_wait=0.0, delays=(0.05,))
registry = SagaRegistry("parallel_orders", retry=FAST)
registry.register(order)
stores = Service("stores", retry=FAST)
#: Retried every 0.1 s for up to 30 s: a reservation that waits for the saga to give up on it.
PATIENT = RetryPolicy(immediate_attempts=1, delays=(0.1,) * 300, delay_jitter=0.0)
#: The stock releases refused so far, per saga.
refused_releases: Counter[UUID | None] = Counter()


@stores.handler(ReserveStock, retry=PATIENT)
def reserve_stock(tx: Tx, cmd: ReserveStock, ctx: HandlerContext) -> StockReserved:
    if cmd.stock_late:
        query = "SELECT status FROM saga.saga_instances WHERE id = %s"
        row = tx.execute(query, (ctx.saga_id,)).fetchone()
        if row is None or row[0] != "compensated":
            raise RuntimeError("the stock service is slow")  # retried until it is late
    record_effect(tx, "stock", cmd.order_id)
    return StockReserved(reference=f"s-{cmd.order_id}")


@stores.handler(ReleaseStock)
def release_stock(tx: Tx, cmd: ReleaseStock, ctx: HandlerContext) -> None:
    if refused_releases[ctx.saga_id] < cmd.release_refusals:
        refused_releases[ctx.saga_id] += 1
        raise StepFailed("the stock ledger is down")
    record_effect(tx, "release_stock", cmd.order_id)


@stores.handler(ReserveCredit)
def reserve_credit(tx: Tx, cmd: ReserveCredit, ctx: HandlerContext) -> None:
    if cmd.credit_fails:
        raise StepFailed("no credit")
    if cmd.credit_breaks:
        raise RuntimeError("the credit service has a bug")  # retried, then a dead letter
    record_effect(tx, "credit", cmd.order_id)


@stores.handler(ReleaseCredit)
def release_credit(tx: Tx, cmd: ReleaseCredit, ctx: HandlerContext) -> None:
    record_effect(tx, "release_credit", cmd.order_id)


@stores.handler(Confirm)
def confirm(tx: Tx, cmd: Confirm, ctx: HandlerContext) -> None:
    record_effect(tx, "confirm", cmd.order_id)


@pytest.fixture(autouse=True)
def _effects_table(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)


def members_out(db: TestDatabase, saga_id: UUID) -> list[str]:
    query = "SELECT step, step_state FROM saga.saga_instances WHERE id = %s"
    (row,) = db.rows(query, (saga_id,))
    return waiting_on(*row)


def effects(db: TestDatabase) -> Counter[str]:
    return Counter(r[0] for r in db.rows("SELECT kind FROM public.effects"))


def timeline(db: TestDatabase, saga_id: UUID) -> list[tuple[str, str, str]]:
    query = "SELECT step, phase, outcome FROM saga.saga_steps WHERE saga_id = %s ORDER BY id"
    return [(r[0], r[1], r[2]) for r in db.rows(query, (saga_id,))]


def test_the_group_completes_once_every_member_answered(
    db: TestDatabase, shared_event_broker: TestBroker
) -> None:
    with saga_system_running(db, shared_event_broker, registry, stores):
        saga_id = start(db, order, Order(order_id="o1"))
        settled(db, saga_id, "completed")
    assert effects(db) == Counter(open=1, stock=1, credit=1, note=1, confirm=1)
    data = db.scalar("SELECT data FROM saga.saga_instances WHERE id = %s", (saga_id,))
    assert data["stock_ref"] == "s-o1"
    members = db.rows(
        "SELECT step FROM saga.saga_steps WHERE saga_id = %s AND outcome = 'succeeded'",
        (saga_id,),
    )
    assert {r[0] for r in members} >= {"reserve_stock", "reserve_credit", "note"}


def test_a_failed_member_undoes_its_siblings_and_the_steps_before_once_each(
    db: TestDatabase, shared_event_broker: TestBroker
) -> None:
    with saga_system_running(db, shared_event_broker, registry, stores):
        saga_id = start(db, order, Order(order_id="o2", credit_fails=True))
        settled(db, saga_id, "compensated")
        # the stock reservation may answer after the failure: its late success is undone
        wait_until(lambda: effects(db)["release_stock"] == 1, timeout=30, what="stock released")
    assert effects(db) == Counter(open=1, note=1, stock=1, release_stock=1, close=1)


def test_a_member_answering_after_the_saga_compensated_is_undone_its_release_retried(
    db: TestDatabase, shared_event_broker: TestBroker
) -> None:
    data = Order(order_id="o9", credit_fails=True, stock_late=True, release_refusals=1)
    undone = ("reserve_stock", "compensation", "succeeded")
    with saga_system_running(db, shared_event_broker, registry, stores):
        saga_id = start(db, order, data)
        wait_until(lambda: undone in timeline(db, saga_id), timeout=30, what="stock released")
    assert effects(db) == Counter(open=1, note=1, stock=1, release_stock=1, close=1)
    assert timeline(db, saga_id)[-3:] == [
        ("reserve_stock", "forward", "late_success"),
        ("reserve_stock", "compensation", "failed"),
        undone,
    ]
    status = db.scalar("SELECT status FROM saga.saga_instances WHERE id = %s", (saga_id,))
    assert status == "compensated"


def test_a_late_members_release_refused_until_its_retries_are_spent_waits_for_a_resume(
    db: TestDatabase, shared_event_broker: TestBroker
) -> None:
    data = Order(order_id="o10", credit_fails=True, stock_late=True, release_refusals=2)
    with saga_system_running(db, shared_event_broker, registry, stores):
        saga_id = start(db, order, data)
        settled(db, saga_id, "compensation_failed")
        listed = saga_cli(db.url, "list", "--status", "compensation_failed", "--json")
        [stopped] = json.loads(listed.stdout)
        assert (stopped["id"], stopped["step"]) == (str(saga_id), "reserve_stock")
        assert stopped["last_error"] == "reserve_stock: the stock ledger is down"
        assert effects(db)["release_stock"] == 0

        resumed = saga_cli(db.url, "resume", str(saga_id), "--reason", "ledger back")
        assert resumed.returncode == 0, resumed.stderr
        settled(db, saga_id, "compensated")
    assert effects(db) == Counter(open=1, note=1, stock=1, release_stock=1, close=1)
    assert [outcome for step, phase, outcome in timeline(db, saga_id)[-4:]] == [
        "late_success", "failed", "failed", "succeeded"
    ]  # fmt: skip


def test_saga_list_and_stats_name_every_member_still_out(db: TestDatabase) -> None:
    with db.connect() as conn:
        registry.check_versions(conn)  # records the shape, as a connecting consumer does
    saga_id = start(db, order, Order(order_id="o3"))  # no participant runs: both members stay out

    listed = json.loads(saga_cli(db.url, "list", "--json").stdout)
    assert [(s["step"], s["waiting_on"]) for s in listed] == [
        ("reserve", ["reserve_stock", "reserve_credit"])
    ]
    table = saga_cli(db.url, "list").stdout
    assert "reserve: reserve_stock, reserve_credit" in table
    stats = json.loads(saga_cli(db.url, "stats", "--stuck-after", "0s", "--json").stdout)
    assert [s["waiting_on"] for s in stats["stuck"]] == [["reserve_stock", "reserve_credit"]]
    shown = saga_cli(db.url, "show", str(saga_id)).stdout
    assert "waiting on: reserve_stock, reserve_credit" in shown


def test_saga_show_draws_the_members_as_one_group(
    db: TestDatabase, shared_event_broker: TestBroker
) -> None:
    with saga_system_running(db, shared_event_broker, registry, stores):
        saga_id = start(db, order, Order(order_id="o4"))
        settled(db, saga_id, "completed")

    shown = json.loads(saga_cli(db.url, "show", str(saga_id), "--json").stdout)
    groups = {entry["step"]: entry["group"] for entry in shown["timeline"]}
    assert groups == {
        "open": None,
        "reserve_stock": "reserve",
        "reserve_credit": "reserve",
        "note": "reserve",
        "confirm": None,
    }
    lines = saga_cli(db.url, "show", str(saga_id)).stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "⫴ reserve (at once)" in line)
    members = [line for line in lines[header + 1 : header + 4] if "├" in line]
    assert len(members) == 3
    assert not any("├" in line and "confirm" in line for line in lines)


def test_saga_resume_sends_again_only_the_member_still_out(
    db: TestDatabase, shared_event_broker: TestBroker
) -> None:
    saga_id = start(db, order, Order(order_id="o5"))
    db.execute("DELETE FROM saga.outbox WHERE message_type = 'ReserveCredit'")  # lost on the way
    with saga_system_running(db, shared_event_broker, registry, stores):
        wait_until(lambda: members_out(db, saga_id) == ["reserve_credit"], 30, what="stock in")
        waiting = json.loads(saga_cli(db.url, "list", "--json").stdout)[0]["waiting_on"]
        assert waiting == ["reserve_credit"]

        resumed = saga_cli(db.url, "resume", str(saga_id), "--stuck-after", "0s")
        assert resumed.returncode == 0, resumed.stderr
        settled(db, saga_id, "completed")
    assert effects(db) == Counter(open=1, stock=1, credit=1, note=1, confirm=1)


def test_saga_cancel_at_a_group_compensates_every_member_once_all_have_answered(
    db: TestDatabase, shared_event_broker: TestBroker
) -> None:
    saga_id = start(db, order, Order(order_id="o6"))
    db.execute("DELETE FROM saga.outbox WHERE message_type = 'ReserveCredit'")  # lost on the way
    with saga_system_running(db, shared_event_broker, registry, stores):
        wait_until(lambda: members_out(db, saga_id) == ["reserve_credit"], 30, what="stock in")
        cancelled = saga_cli(db.url, "cancel", str(saga_id))
        assert cancelled.returncode == 0, cancelled.stderr
        # the cancel waits for the member still out: resumed, it answers, then all compensate
        resumed = saga_cli(db.url, "resume", str(saga_id), "--stuck-after", "0s")
        assert resumed.returncode == 0, resumed.stderr
        settled(db, saga_id, "compensated")
        wait_until(lambda: effects(db)["close"] == 1, timeout=30, what="order closed")
    assert effects(db) == Counter(
        open=1, stock=1, credit=1, note=1, release_stock=1, release_credit=1, close=1
    )


def test_a_dead_lettered_member_compensates_and_its_replay_is_refused_as_superseded(
    db: TestDatabase, shared_event_broker: TestBroker
) -> None:
    with saga_system_running(db, shared_event_broker, registry, stores):
        saga_id = start(db, order, Order(order_id="o7", credit_breaks=True))
        settled(db, saga_id, "compensated")
        wait_until(lambda: effects(db)["release_stock"] == 1, timeout=30, what="stock released")
        (letter,) = json.loads(saga_cli(db.url, "dlq", "list", "--json").stdout)
        assert letter["message_type"] == "ReserveCredit"

        replayed = saga_cli(db.url, "dlq", "replay", str(letter["id"]))
        assert "superseded" in replayed.stdout + replayed.stderr, replayed
    # the member whose outcome was unknown was compensated too; nothing ran it again
    assert effects(db) == Counter(
        open=1, note=1, stock=1, release_stock=1, release_credit=1, close=1
    )
