"""A fan-out of 1,000 items on real PostgreSQL, over RabbitMQ and the PostgreSQL broker:
every item reserved once and gathered into the data, then, when a later step fails, every
item released once; a failed item releasing exactly the items that took effect; and
releases that fail at first retried, each on its own, while the others go on."""

from __future__ import annotations

import threading
from collections import Counter
from uuid import UUID

import pytest
from pydantic import BaseModel

from saga import HandlerContext, RetryPolicy, Saga, SagaRegistry, Service, StepFailed, Tx
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.instances import settled, start
from tests.support.running import saga_system_running
from tests.support.services import EFFECTS_DDL, record_effect

ITEMS = 1_000


class Line(BaseModel):
    sku: str
    qty: int = 1


class Order(BaseModel):
    order_id: str
    lines: list[Line]
    fail_sku: str | None = None  # the line the stock service refuses
    release_fails_once_every: int = 0  # every n-th line's release fails at first (0: none)
    confirm_fails: bool = False
    reserved: int = 0  # gathered from every line's reply


class ReserveLine(BaseModel):
    sku: str
    qty: int
    fails: bool


class LineReserved(BaseModel):
    qty: int


class ReleaseLine(BaseModel):
    sku: str
    fails_once: bool = False


def release(data: Order, line: Line) -> ReleaseLine:
    every = data.release_fails_once_every
    return ReleaseLine(sku=line.sku, fails_once=every > 0 and int(line.sku[-4:]) % every == 0)


class Confirm(BaseModel):
    order_id: str
    confirm_fails: bool


order = Saga("fan_out_order", data=Order)
order.for_each(
    "reserve_lines",
    items=lambda d: d.lines,
    service="fan_stock",
    command=lambda d, line: ReserveLine(sku=line.sku, qty=line.qty, fails=line.sku == d.fail_sku),
    reply=LineReserved,
    on_reply=lambda d, line, r: d.model_copy(update={"reserved": d.reserved + r.qty}),
    compensate=release,
    max_in_flight=50,
    key=lambda line: line.sku,
)
order.remote("confirm", service="fan_stock", command=Confirm)

FAST = RetryPolicy(immediate_attempts=2, immediate_initial_wait=0.0, delays=(0.05,))
registry = SagaRegistry("fan_out_orders", retry=FAST)
registry.register(order)
stock = Service("fan_stock", retry=FAST)


@stock.handler(ReserveLine)
def reserve_line(tx: Tx, cmd: ReserveLine, ctx: HandlerContext) -> LineReserved:
    if cmd.fails:
        raise StepFailed(f"no stock for {cmd.sku}")
    record_effect(tx, "reserve", cmd.sku)
    return LineReserved(qty=cmd.qty)


#: (saga, sku) of the releases that failed once already; the services run in this process.
failed_once: set[tuple[UUID | None, str]] = set()
failed_once_lock = threading.Lock()


@stock.handler(ReleaseLine)
def release_line(tx: Tx, cmd: ReleaseLine, ctx: HandlerContext) -> None:
    if cmd.fails_once:
        with failed_once_lock:
            first = (ctx.envelope.saga_id, cmd.sku) not in failed_once
            failed_once.add((ctx.envelope.saga_id, cmd.sku))
        if first:
            raise StepFailed(f"stock busy releasing {cmd.sku}")
    record_effect(tx, "release", cmd.sku)


@stock.handler(Confirm)
def confirm(tx: Tx, cmd: Confirm, ctx: HandlerContext) -> None:
    if cmd.confirm_fails:
        raise StepFailed("not confirmed")


@pytest.fixture(autouse=True)
def _effects_table(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)


def lines(count: int) -> list[Line]:
    return [Line(sku=f"sku-{n:04d}") for n in range(count)]


def effects(db: TestDatabase, kind: str) -> Counter[str]:
    rows = db.rows("SELECT key FROM public.effects WHERE kind = %s", (kind,))
    return Counter(r[0] for r in rows)


@pytest.mark.slow
def test_a_thousand_items_complete_then_are_released_once_each_when_a_later_step_fails(
    db: TestDatabase, shared_event_broker: TestBroker
) -> None:
    data = Order(order_id="o1", lines=lines(ITEMS), confirm_fails=True)
    with saga_system_running(db, shared_event_broker, registry, stock):
        saga_id = start(db, order, data)
        settled(db, saga_id, "compensated", timeout=600)
    every = Counter(line.sku for line in data.lines)
    assert effects(db, "reserve") == every
    assert effects(db, "release") == every
    saved = db.scalar("SELECT data FROM saga.saga_instances WHERE id = %s", (saga_id,))
    assert saved["reserved"] == ITEMS


@pytest.mark.slow
def test_a_failed_item_releases_exactly_the_items_that_took_effect(
    db: TestDatabase, shared_event_broker: TestBroker
) -> None:
    data = Order(order_id="o2", lines=lines(200), fail_sku="sku-0150")
    with saga_system_running(db, shared_event_broker, registry, stock):
        saga_id = start(db, order, data)
        settled(db, saga_id, "compensated", timeout=600)
    reserved = effects(db, "reserve")
    assert 0 < len(reserved) < 200 and "sku-0150" not in reserved
    assert set(reserved.values()) == {1}
    assert effects(db, "release") == reserved
    error = db.scalar("SELECT last_error FROM saga.saga_instances WHERE id = %s", (saga_id,))
    assert error == "reserve_lines[150]: no stock for sku-0150"


@pytest.mark.slow
def test_compensation_retries_each_failing_release_on_its_own_and_releases_every_item_once(
    db: TestDatabase, shared_event_broker: TestBroker
) -> None:
    data = Order(order_id="o3", lines=lines(120), confirm_fails=True, release_fails_once_every=7)
    with saga_system_running(db, shared_event_broker, registry, stock):
        saga_id = start(db, order, data)
        settled(db, saga_id, "compensated", timeout=600)
    every = Counter(line.sku for line in data.lines)
    assert effects(db, "release") == every
    failed = db.scalar(
        "SELECT count(*) FROM saga.saga_steps WHERE saga_id = %s AND step = 'reserve_lines'"
        " AND phase = 'compensation' AND outcome = 'failed'",
        (saga_id,),
    )
    assert failed == len(range(0, 120, 7))  # each failed once, then its retry succeeded
