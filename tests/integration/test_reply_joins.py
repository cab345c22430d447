"""The consumer of a saga's home waits a moment for the replies of a parallel group's other
members when one arrives alone, and handles them in one transaction, on RabbitMQ and on the
PostgreSQL broker; with the wait turned off, each reply has a transaction of its own."""

from __future__ import annotations

import time
from contextlib import ExitStack

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

registry = SagaRegistry("joined_orders")
registry.register(order)
stock, credit = Service("stock"), Service("credit")

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


def reply_transactions(db: TestDatabase) -> int:
    """The transactions the home's consumer handled the replies in (an inbox row's
    ``received_at`` is its transaction's start)."""
    query = "SELECT count(DISTINCT received_at) FROM saga.inbox WHERE consumer = %s"
    return int(db.scalar(query, (registry.service_name,)))


@pytest.mark.parametrize(("linger", "transactions"), [(5.0, 1), (0.0, 2)])
def test_the_replies_of_a_group_are_handled_together_when_the_home_waits_for_them(
    db: TestDatabase, shared_event_broker: TestBroker, linger: float, transactions: int
) -> None:
    broker = shared_event_broker
    with ExitStack() as stack:
        stack.enter_context(running_relay(db, broker))
        stack.enter_context(running_service(registry.as_service(), db, broker, reply_linger=linger))
        stack.enter_context(running_service(stock, db, broker))
        stack.enter_context(running_service(credit, db, broker))
        saga_id = start(db, order, Order(order_id="o1"))
        settled(db, saga_id, "completed")
    assert reply_transactions(db) == transactions
