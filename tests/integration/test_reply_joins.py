"""The consumer of a saga's home waits a moment for the replies of a parallel group's other
members (or of a fan-out's other items) when one arrives alone, and handles them in one
transaction, on RabbitMQ and on the PostgreSQL broker; with the wait turned off, each reply
has a transaction of its own."""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any

import pytest
from pydantic import BaseModel

from saga import HandlerContext, Saga, SagaRegistry, Service, Tx
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.instances import settled, start
from tests.support.running import running_relay, running_service


class Order(BaseModel):
    order_id: str


class ReserveStock(BaseModel):
    order_id: str


class ReserveCredit(BaseModel):
    order_id: str


class Reserved(BaseModel):
    reference: str


order = Saga("joined_order", data=Order)
with order.parallel("reserve"):
    order.remote("reserve_stock", service="stock", command=ReserveStock, reply=Reserved)
    order.remote("reserve_credit", service="credit", command=ReserveCredit, reply=Reserved)


class Lines(BaseModel):
    order_id: str
    skus: list[str]


class ReserveLine(BaseModel):
    sku: str


lined = Saga("lined_order", data=Lines)
lined.for_each("reserve_lines", items=lambda d: d.skus, service="lines",
               command=lambda d, sku: ReserveLine(sku=sku), reply=Reserved)  # fmt: skip

registry = SagaRegistry("joined_orders")
registry.register(order)
lined_registry = SagaRegistry("lined_orders")
lined_registry.register(lined)
stock, credit, lines = Service("stock"), Service("credit"), Service("lines")

#: How much later than the stock's the credit's reply leaves: well inside the linger the
#: test gives the home's consumer, and far longer than a consumer takes to pick one up.
CREDIT_LATER = 0.3


@stock.handler(ReserveStock)
def reserve_stock(tx: Tx, cmd: ReserveStock, ctx: HandlerContext) -> Reserved:
    return Reserved(reference=f"s-{cmd.order_id}")


@credit.handler(ReserveCredit)
def reserve_credit(tx: Tx, cmd: ReserveCredit, ctx: HandlerContext) -> Reserved:
    time.sleep(CREDIT_LATER)  # a slower participant (not a wait for a condition)
    return Reserved(reference=f"c-{cmd.order_id}")


#: How long each line's reservation takes: its replies leave this far apart.
LINE_TAKES = 0.1


@lines.handler(ReserveLine)
def reserve_line(tx: Tx, cmd: ReserveLine, ctx: HandlerContext) -> Reserved:
    time.sleep(LINE_TAKES)  # a slower participant (not a wait for a condition)
    return Reserved(reference=f"l-{cmd.sku}")


def reply_transactions(db: TestDatabase, home: SagaRegistry) -> int:
    """The transactions the home's consumer handled the replies in (an inbox row's
    ``received_at`` is its transaction's start)."""
    query = "SELECT count(DISTINCT received_at) FROM saga.inbox WHERE consumer = %s"
    return int(db.scalar(query, (home.service_name,)))


#: Each case: the saga's home, the saga, its data, its participants with their consumer
#: options, and the transactions its replies take when the home does not wait.
Participants = list[tuple[Service, dict[str, Any]]]
CASES: dict[str, tuple[SagaRegistry, Saga[Any], BaseModel, Participants, int]] = {
    "group": (registry, order, Order(order_id="o1"), [(stock, {}), (credit, {})], 2),
    # one line at a time: each reply leaves in a transaction of its own, LINE_TAKES apart
    "fan-out": (lined_registry, lined, Lines(order_id="o2", skus=["a", "b", "c"]),
                [(lines, {"prefetch": 1})], 3),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("linger", [5.0, 0.0])
def test_replies_sent_together_are_handled_together_when_the_home_waits_for_them(
    db: TestDatabase, shared_event_broker: TestBroker, case: str, linger: float
) -> None:
    home, saga, data, participants, apart = CASES[case]
    broker = shared_event_broker
    with ExitStack() as stack:
        stack.enter_context(running_relay(db, broker))
        stack.enter_context(running_service(home.as_service(), db, broker, reply_linger=linger))
        for participant, options in participants:
            stack.enter_context(running_service(participant, db, broker, **options))
        saga_id = start(db, saga, data)
        settled(db, saga_id, "completed")
    assert reply_transactions(db, home) == (1 if linger else apart)
