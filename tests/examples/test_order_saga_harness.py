"""The order saga's logic, tested the way a user of saga.testing would.

The orders registry and the inventory and customers services run for real on the
test database; payments (whose handlers call a card gateway) is left out, so
the test answers its commands. Nothing here sleeps: retries follow the clock.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from saga.examples.order_saga import customers, inventory
from saga.examples.order_saga.messages import (
    CardCharged,
    ChargeCard,
    RefundCharge,
    ReleaseCredit,
    ReleaseStock,
    ReserveCredit,
    ReserveStock,
    ScheduleShipment,
)
from saga.examples.order_saga.orders import OrderData, OrderLine, create_order, registry
from saga.testing import SagaHarness

SCHEMA = sorted((Path(customers.__file__).parent / "schema").glob("*.sql"))


@pytest.fixture
def h(saga_harness) -> SagaHarness:
    harness = saga_harness(registry, services=[inventory.service, customers.service], schema=SCHEMA)
    with harness.transaction() as tx:
        tx.execute("INSERT INTO stock VALUES ('sku-1', 10, 10), ('sku-2', 5, 5)")
        tx.execute("INSERT INTO credit VALUES ('c1', 1000, 1000)")
    return harness


def order(**changes: object) -> OrderData:
    fields = dict(order_id="o1", customer_id="c1", sku="sku-1", quantity=2, amount_cents=500,
                  card_token="tok", region="eu")  # fmt: skip
    return OrderData.model_validate({**fields, **changes})


def test_an_order_completes(h: SagaHarness) -> None:
    saga_id = h.start(create_order, order())
    h.expect_command("payments", ChargeCard(order_id="o1", amount_cents=500, card_token="tok")
                     ).reply(CardCharged(charge_id="ch-1"))  # fmt: skip
    h.run_until_idle()

    assert h.status(saga_id) == "completed"
    h.assert_consumed(
        "inventory",
        ReserveStock(order_id="o1", sku="sku-1", quantity=2),
        ScheduleShipment(order_id="o1", region="eu"),  # ships every line's reservation
    )
    h.assert_consumed("customers", ReserveCredit(order_id="o1", customer_id="c1",
                                                 amount_cents=500))  # fmt: skip
    assert h.rows("SELECT status FROM orders") == [("approved",)]
    assert h.rows("SELECT available FROM stock WHERE sku = 'sku-1'") == [(8,)]


def lines(*lines: tuple[str, int]) -> OrderData:
    return order(sku=None, quantity=None, lines=[OrderLine(sku=k, quantity=q) for k, q in lines])


def test_an_order_of_two_lines_ships_both(h: SagaHarness) -> None:
    h.on("payments", ChargeCard, CardCharged(charge_id="ch-1"))
    saga_id = h.start(create_order, lines(("sku-1", 2), ("sku-2", 5)))
    h.run_until_idle()

    assert h.status(saga_id) == "completed"
    assert h.rows("SELECT sku, available FROM stock ORDER BY sku") == [("sku-1", 8), ("sku-2", 0)]
    assert h.rows("SELECT sku, status FROM stock_reservations ORDER BY sku") == [
        ("sku-1", "shipped"),
        ("sku-2", "shipped"),
    ]


def test_a_line_out_of_stock_puts_the_other_lines_back(h: SagaHarness) -> None:
    saga_id = h.start(create_order, lines(("sku-1", 2), ("sku-2", 6), ("sku-1", 1)))
    h.run_until_idle()

    assert h.status(saga_id) == "compensated"
    assert h.rows("SELECT sku, available FROM stock ORDER BY sku") == [("sku-1", 10), ("sku-2", 5)]
    assert h.rows("SELECT DISTINCT status FROM stock_reservations") in ([], [("released",)])
    assert h.rows("SELECT available FROM credit") == [(1000,)]


def test_no_stock_rejects_the_order(h: SagaHarness) -> None:
    saga_id = h.start(create_order, order(quantity=99))
    h.run_until_idle()

    assert h.status(saga_id) == "compensated"
    # credit is reserved at the same time as stock; it answers after the saga compensated
    # (stock answered first), so its late success is undone, the release awaited
    assert h.steps(saga_id) == [
        "create_pending_order succeeded",
        "reserve_lines failed",
        "create_pending_order compensation succeeded",
        "reserve_credit late_success",
        "reserve_credit compensation succeeded",
    ]
    h.assert_sent("customers", ReserveCredit, ReleaseCredit(order_id="o1"))
    assert h.rows("SELECT available FROM credit") == [(1000,)]
    assert h.rows("SELECT status FROM orders") == [("rejected",)]


def test_no_credit_releases_the_stock(h: SagaHarness) -> None:
    saga_id = h.start(create_order, order(amount_cents=5000))
    h.run_until_idle()

    assert h.status(saga_id) == "compensated"
    h.assert_sent("customers", ReserveCredit(order_id="o1", customer_id="c1", amount_cents=5000))
    h.assert_sent("inventory", ReserveStock(order_id="o1", sku="sku-1", quantity=2),
                  ReleaseStock(order_id="o1"))  # fmt: skip
    assert h.rows("SELECT available FROM stock WHERE sku = 'sku-1'") == [(10,)]


def test_a_declined_card_releases_credit_and_stock(h: SagaHarness) -> None:
    saga_id = h.start(create_order, order())
    h.expect_command("payments", ChargeCard).fail("card declined", code="declined")
    h.run_until_idle()

    assert h.status(saga_id) == "compensated"
    h.assert_sent("customers", ReserveCredit, ReleaseCredit(order_id="o1"))
    h.assert_sent("inventory", ReserveStock, ReleaseStock(order_id="o1"))
    assert h.rows("SELECT available FROM credit") == [(1000,)]


def test_a_closed_region_refunds_the_charge(h: SagaHarness) -> None:
    h.on("payments", ChargeCard, CardCharged(charge_id="ch-1"))
    with h.transaction() as tx:
        tx.execute("INSERT INTO closed_regions VALUES ('eu')")
    saga_id = h.start(create_order, order())
    h.expect_command("payments", RefundCharge(order_id="o1")).reply(CardCharged(charge_id="-"))
    h.run_until_idle()

    assert h.status(saga_id) == "compensated"
    h.assert_sent("inventory", ReserveStock, ScheduleShipment, ReleaseStock(order_id="o1"))


def test_a_compensation_that_fails_is_retried_later(h: SagaHarness) -> None:
    h.fail_transiently("inventory", ReleaseStock, times=3)  # every immediate try
    saga_id = h.start(create_order, order(amount_cents=5000))
    h.run_until_idle()
    assert h.status(saga_id) == "compensating"  # the release waits for its delayed retry

    h.advance(timedelta(seconds=2))
    assert h.status(saga_id) == "compensated"
    assert h.rows("SELECT available FROM stock WHERE sku = 'sku-1'") == [(10,)]


def test_a_cancelled_order_compensates_once_the_charge_answers(h: SagaHarness) -> None:
    saga_id = h.start(create_order, order())
    charge = h.expect_command("payments", ChargeCard)
    h.cancel(saga_id, "customer changed their mind")
    charge.reply(CardCharged(charge_id="ch-1"))
    h.expect_command("payments", RefundCharge(order_id="o1")).reply(CardCharged(charge_id="-"))
    h.run_until_idle()

    assert h.status(saga_id) == "compensated"
    h.assert_sent("inventory", ReserveStock, ReleaseStock(order_id="o1"))


def test_the_pivot_is_retried_until_it_goes_through(h: SagaHarness) -> None:
    h.on("payments", ChargeCard, CardCharged(charge_id="ch-1"))
    h.fail_transiently("inventory", ScheduleShipment, times=4)  # one delayed retry
    saga_id = h.start(create_order, order())
    h.run_until_idle()
    assert h.status(saga_id) == "running"

    h.advance(timedelta(seconds=2))
    assert h.status(saga_id) == "completed"
