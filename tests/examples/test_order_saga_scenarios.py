"""The order saga's logic alone, on its pure transitions: no database, no service.

Its two local steps (the order row) are stubbed; every participant is answered
by the test. The harness tests (test_order_saga_harness.py) run the same flows
with the real inventory and customers services on PostgreSQL.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import psycopg
import pytest
from pydantic import BaseModel

from saga import Saga, StepFailed
from saga.examples.order_saga.messages import (
    CardCharged,
    ChargeCard,
    CreditReserved,
    RefundCharge,
    ReleaseCredit,
    ReleaseStock,
    ReserveCredit,
    ReserveStock,
    ScheduleShipment,
    ShipmentScheduled,
    StockReserved,
)  # fmt: skip
from saga.examples.order_saga.orders import (
    OrderData,
    OrderLine,
    create_order,
    create_order_v1,
    create_order_v2,
)
from saga.messaging.envelope import COMPENSATES_HEADER
from saga.testing import Fail, PayloadMismatch, SagaScenario

#: The order saga's local steps only write the order row: here they do nothing.
NO_ORDER_ROW = {"create_pending_order": None, "reject_order": None, "approve_order": None}


def order(**changes: object) -> OrderData:
    fields = dict(order_id="o1", customer_id="c1", sku="sku-1", quantity=2, amount_cents=500,
                  card_token="tok", region="eu")  # fmt: skip
    return OrderData.model_validate({**fields, **changes})


def test_an_order_completes_step_by_step() -> None:
    s = SagaScenario(create_order, order(), local_steps=NO_ORDER_ROW)
    s.expect_command("inventory", ReserveStock(order_id="o1", sku="sku-1", quantity=2)
                     ).reply(StockReserved(reservation_id="st-1"))  # fmt: skip
    s.expect_command("customers", ReserveCredit(order_id="o1", customer_id="c1", amount_cents=500)
                     ).reply(CreditReserved(reservation_id="cr-1"))  # fmt: skip
    s.expect_command("payments", ChargeCard).reply(CardCharged(charge_id="ch-1"))
    shipment = ScheduleShipment(order_id="o1", region="eu")  # every line's reservation
    s.expect_command("inventory", shipment).reply(ShipmentScheduled(shipment_id="sh-1"))
    s.run_until_idle()

    assert s.status == "completed"
    assert s.data == order(credit_reservation_id="cr-1", charge_id="ch-1", shipment_id="sh-1")
    assert s.local_calls == ["create_pending_order", "approve_order"]


def test_no_credit_releases_the_stock_and_rejects_the_order() -> None:
    s = SagaScenario(create_order, order(), local_steps=NO_ORDER_ROW)
    s.expect_command("inventory", ReserveStock).reply(StockReserved(reservation_id="st-1"))
    s.expect_command("customers", ReserveCredit).fail("insufficient credit")
    s.expect_command("inventory", ReleaseStock(order_id="o1")).reply()
    s.run_until_idle()

    assert s.status == "compensated"
    assert s.local_calls == ["create_pending_order", "reject_order"]
    assert s.steps[-2:] == ["reserve_lines compensation succeeded",
                            "create_pending_order compensation succeeded"]  # fmt: skip


#: The participants' answers when all goes well.
ANSWERS = [
    ("inventory", ReserveStock, StockReserved(reservation_id="st-1")),
    ("customers", ReserveCredit, CreditReserved(reservation_id="cr-1")),
    ("payments", ChargeCard, CardCharged(charge_id="ch-1")),
]


@pytest.mark.parametrize(
    ("refused", "undone"),
    [
        # the credit, reserved beside the stock, is released (its late success's release
        # is awaited like any compensation)
        (ReserveStock, [("customers", ReleaseCredit)]),
        (ReserveCredit, [("inventory", ReleaseStock)]),
        (ChargeCard, [("customers", ReleaseCredit), ("inventory", ReleaseStock)]),
    ],
)
def test_a_refused_step_compensates_the_steps_before_it(
    refused: type[BaseModel], undone: list[tuple[str, type[BaseModel]]]
) -> None:
    s = SagaScenario(create_order, order(), local_steps=NO_ORDER_ROW)
    for service, command, answer in ANSWERS:
        s.on(service, command, Fail("refused") if command is refused else answer)
    for service, compensation in undone:
        s.expect_command(service, compensation(order_id="o1")).reply()
    s.run_until_idle()

    assert s.status == "compensated"
    assert s.local_calls == ["create_pending_order", "reject_order"]


def test_a_compensation_refused_once_is_retried_on_the_virtual_clock() -> None:
    s = SagaScenario(create_order, order(), local_steps=NO_ORDER_ROW)
    s.expect_command("inventory", ReserveStock).reply(StockReserved(reservation_id="st-1"))
    s.expect_command("customers", ReserveCredit).fail("insufficient credit")
    s.expect_command("inventory", ReleaseStock).fail("inventory busy")
    assert s.status == "compensating"

    s.advance(timedelta(seconds=2))
    s.expect_command("inventory", ReleaseStock).reply()
    s.run_until_idle()
    assert s.status == "compensated"
    s.assert_sent("inventory", ReserveStock, ReleaseStock, ReleaseStock)


def test_a_refused_shipment_refunds_the_charge_and_releases_the_rest() -> None:
    s = SagaScenario(create_order, order(), local_steps=NO_ORDER_ROW)
    for service, command, answer in ANSWERS:
        s.on(service, command, answer)
    s.expect_command("inventory", ScheduleShipment).fail("region closed")
    s.expect_command("payments", RefundCharge(order_id="o1")).reply()
    s.expect_command("customers", ReleaseCredit(order_id="o1")).reply()
    s.expect_command("inventory", ReleaseStock(order_id="o1")).reply()
    s.run_until_idle()

    assert s.status == "compensated"
    assert s.local_calls == ["create_pending_order", "reject_order"]


def test_a_local_step_stub_can_refuse() -> None:
    def no_pending_order(d: OrderData) -> None:
        raise StepFailed("duplicate order")

    s = SagaScenario(create_order, order(), local_steps={"create_pending_order": no_pending_order})
    assert s.status == "compensated"
    assert s.sent == []
    assert s.steps == ["create_pending_order failed"]


def test_a_local_step_left_unstubbed_says_how_to_stub_it() -> None:
    with pytest.raises(AssertionError, match=r"stub it: local_steps=\{'create_pending_order'"):
        SagaScenario(create_order, order())


def test_a_wrong_command_shows_both_payloads() -> None:
    s = SagaScenario(create_order, order(quantity=3), local_steps=NO_ORDER_ROW)
    with pytest.raises(PayloadMismatch, match=r"quantity +2 +3 +<-- differs"):
        s.expect_command("inventory", ReserveStock(order_id="o1", sku="sku-1", quantity=2))


def lines(*lines: tuple[str, int]) -> OrderData:
    return order(sku=None, quantity=None, lines=[OrderLine(sku=k, quantity=q) for k, q in lines])


def test_each_line_is_reserved_with_the_credit_at_once_and_the_shipment_takes_them_all() -> None:
    s = SagaScenario(create_order, lines(("a", 1), ("b", 2), ("c", 3)), local_steps=NO_ORDER_ROW)
    assert [m.payload["sku"] for m in s.sent_to("inventory")] == ["a", "b", "c"]
    assert len(s.sent_to("customers")) == 1  # in the same transition as the lines
    s.expect_command("inventory", ReserveStock(order_id="o1", sku="b", quantity=2)
                     ).reply(StockReserved(reservation_id="st-b"))  # fmt: skip
    s.expect_command("customers", ReserveCredit).reply(CreditReserved(reservation_id="cr-1"))
    s.expect_command("inventory", ReserveStock(order_id="o1", sku="c", quantity=3)
                     ).reply(StockReserved(reservation_id="st-c"))  # fmt: skip
    s.run_until_idle()
    assert s.sent_to("payments") == []  # line a is still out
    s.expect_command("inventory", ReserveStock(order_id="o1", sku="a", quantity=1)
                     ).reply(StockReserved(reservation_id="st-a"))  # fmt: skip
    s.expect_command("payments", ChargeCard).reply(CardCharged(charge_id="ch-1"))
    s.expect_command("inventory", ScheduleShipment(order_id="o1", region="eu")).reply(
        ShipmentScheduled(shipment_id="sh-1")
    )
    s.run_until_idle()
    assert s.status == "completed"


def test_a_line_out_of_stock_releases_the_lines_reserved_and_the_credit() -> None:
    s = SagaScenario(create_order, lines(("a", 1), ("rare", 1), ("c", 1)), local_steps=NO_ORDER_ROW)
    s.expect_command("inventory", ReserveStock(order_id="o1", sku="a", quantity=1)
                     ).reply(StockReserved(reservation_id="st-a"))  # fmt: skip
    s.expect_command("customers", ReserveCredit).reply(CreditReserved(reservation_id="cr-1"))
    s.expect_command("inventory", ReserveStock(order_id="o1", sku="rare", quantity=1)
                     ).fail("not enough rare in stock")  # fmt: skip
    s.expect_command("customers", ReleaseCredit(order_id="o1")).reply()
    s.expect_command("inventory", ReleaseStock(order_id="o1")).reply()  # line a's
    s.run_until_idle()
    assert s.status == "compensated"  # line c was still out: no longer waited for
    s.expect_command("inventory", ReserveStock(order_id="o1", sku="c", quantity=1)
                     ).reply(StockReserved(reservation_id="st-c"))  # fmt: skip
    s.run_until_idle()
    releases = [m for m in s.sent_to("inventory") if m.type.endswith("ReleaseStock")]
    keys = [m.envelope.headers[COMPENSATES_HEADER].rsplit(":", 2)[1:] for m in releases]
    assert keys == [["0", "a"], ["2", "c"]]  # c's late success undone, under its own key
    assert s.local_calls == ["create_pending_order", "reject_order"]


def test_an_order_gives_its_lines_or_its_one_sku_and_the_two_agree() -> None:
    single = order()
    assert single.lines == [OrderLine(sku="sku-1", quantity=2)]
    assert lines(("a", 4)).sku == "a" and lines(("a", 4)).quantity == 4
    assert lines(("a", 1), ("b", 1)).sku is None
    with pytest.raises(ValueError, match="not both"):
        order(lines=[OrderLine(sku="other", quantity=1)])
    with pytest.raises(ValueError, match="needs lines, or a sku and a quantity"):
        order(sku=None)


@pytest.mark.parametrize("saga", [create_order_v1, create_order_v2], ids=["v1", "v2"])
def test_versions_1_and_2_still_finish_a_saga_begun_before_orders_had_lines(
    saga: Saga[OrderData],
) -> None:
    begun = order().model_dump(exclude={"lines"})  # as such a saga's record holds its data
    s = SagaScenario(saga, OrderData.model_validate(begun), local_steps=NO_ORDER_ROW)
    s.expect_command("inventory", ReserveStock(order_id="o1", sku="sku-1", quantity=2)
                     ).reply(StockReserved(reservation_id="st-1"))  # fmt: skip
    s.expect_command("customers", ReserveCredit).reply(CreditReserved(reservation_id="cr-1"))
    s.expect_command("payments", ChargeCard).reply(CardCharged(charge_id="ch-1"))
    shipment = ScheduleShipment(order_id="o1", stock_reservation_id="st-1", region="eu")
    s.expect_command("inventory", shipment).reply(ShipmentScheduled(shipment_id="sh-1"))
    s.run_until_idle()
    assert s.status == "completed"


def test_the_scenarios_open_no_connection_and_never_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """What keeps a scenario to milliseconds however loaded the machine: it opens no
    database or network connection, and nothing in it waits on the real clock."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a scenario connected or slept: {args} {kwargs}")

    monkeypatch.setattr(psycopg.Connection, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(time, "sleep", refuse)
    for _ in range(20):
        test_an_order_completes_step_by_step()
        test_a_compensation_refused_once_is_retried_on_the_virtual_clock()
