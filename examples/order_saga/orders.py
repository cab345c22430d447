"""The orders service: home of the create_order saga (the whole flow is in this file).

It publishes ``OrderApproved`` when an order goes through and ``OrderRejected`` when it is
turned down, from the saga's local steps, in the orchestrator's transaction: the event
leaves only if the order's new status commits. Orders does not know who listens
(notifications and analytics do).
"""

from __future__ import annotations

import os
from contextlib import nullcontext

from pydantic import BaseModel, Field, model_validator

from saga import Saga, SagaRegistry, Tx
from saga.errors import ConfigurationError
from saga.examples.order_saga.messages import (
    CardCharged,
    ChargeCard,
    CreditReserved,
    OrderApproved,
    OrderRejected,
    RefundCharge,
    ReleaseCredit,
    ReleaseStock,
    ReserveCredit,
    ReserveStock,
    ScheduleShipment,
    ShipmentScheduled,
    StockReserved,
)  # fmt: skip


class OrderLine(BaseModel):
    sku: str
    quantity: int = Field(gt=0)


class OrderData(BaseModel):
    """An order: its ``lines``, or one ``sku`` and ``quantity`` (an order of one line, as
    every order was before lines; sagas begun then carry only those two). Either form gives
    both: one line fills ``sku`` and ``quantity``, and those fill ``lines``. Versions 1 and
    2 reserve ``sku`` alone, so they take orders of one line only."""

    order_id: str
    customer_id: str
    lines: list[OrderLine] = []
    sku: str | None = None
    quantity: int | None = None
    amount_cents: int
    card_token: str
    region: str
    stock_reservation_id: str | None = None
    credit_reservation_id: str | None = None
    charge_id: str | None = None
    shipment_id: str | None = None

    @model_validator(mode="after")
    def _lines_and_sku_agree(self) -> OrderData:
        if self.sku is not None and self.quantity is not None:
            single = OrderLine(sku=self.sku, quantity=self.quantity)
            if not self.lines:
                self.lines = [single]
            elif self.lines != [single]:
                raise ValueError("give the order's lines, or its one sku and quantity, not both")
        elif not self.lines:
            raise ValueError("an order needs lines, or a sku and a quantity")
        elif len(self.lines) == 1:
            self.sku, self.quantity = self.lines[0].sku, self.lines[0].quantity
        return self


#: Publish OrderApproved and OrderRejected ("false" on a broker that carries commands only).
PUBLISH_EVENTS = os.environ.get("ORDERS_PUBLISH_EVENTS", "true") != "false"

#: What a dead-lettered charge means: "hold" the saga for the operator (replay the letter
#: to charge, purge it to compensate), or "compensate" at once, the charge included.
CHARGE_ON_DEAD_LETTER = os.environ.get("ORDERS_CHARGE_ON_DEAD_LETTER", "hold")

#: How new orders reserve stock and credit: "lines" (version 3, one ReserveStock per line
#: and the credit, all at once), "parallel" (version 2, the one sku's stock and the credit
#: at once) or "sequential" (version 1, stock first, then credit), to measure one against
#: another. Every version stays registered, so sagas of each finish whatever the switch.
RESERVE = os.environ.get("ORDERS_RESERVE", "lines")


def create_pending_order(tx: Tx, d: OrderData) -> None:
    # The HTTP front door (http_api.py) writes the row in the transaction that starts the saga.
    tx.execute(
        "INSERT INTO orders (id, customer_id, amount_cents, status) VALUES (%s, %s, %s, 'pending') "
        "ON CONFLICT (id) DO NOTHING",
        (d.order_id, d.customer_id, d.amount_cents),
    )


def reject_order(tx: Tx, d: OrderData) -> None:
    tx.execute("UPDATE orders SET status = 'rejected' WHERE id = %s", (d.order_id,))
    if PUBLISH_EVENTS:
        registry.outbox.publish(tx, OrderRejected(order_id=d.order_id, customer_id=d.customer_id))


def approve_order(tx: Tx, d: OrderData) -> None:
    tx.execute("UPDATE orders SET status = 'approved' WHERE id = %s", (d.order_id,))
    if PUBLISH_EVENTS:
        approved = OrderApproved(
            order_id=d.order_id, customer_id=d.customer_id, amount_cents=d.amount_cents
        )
        registry.outbox.publish(tx, approved)


def build_create_order(version: int) -> Saga[OrderData]:
    """The create_order saga. Version 3 reserves every line of the order (a fan-out) and
    the credit at once, in a parallel group; version 2 the one sku's stock and the credit
    at once; version 1 the stock, then the credit. Nothing else differs."""
    saga = Saga("create_order", data=OrderData, version=version)
    saga.local("create_pending_order", compensate="reject_order")(create_pending_order)
    saga.local_compensation("reject_order")(reject_order)
    with saga.parallel("reserve") if version >= 2 else nullcontext():
        if version >= 3:
            saga.for_each(  # the shipment takes every reservation of the order
                "reserve_lines",
                items=lambda d: d.lines,
                service="inventory",
                command=lambda d, line: ReserveStock(
                    order_id=d.order_id, sku=line.sku, quantity=line.quantity
                ),
                reply=StockReserved,
                compensate=lambda d, line: ReleaseStock(order_id=d.order_id),
                key=lambda line: line.sku,
            )
        else:
            saga.remote(
                "reserve_stock",
                service="inventory",
                command=ReserveStock,
                reply=StockReserved,
                on_reply=lambda d, r: d.model_copy(
                    update={"stock_reservation_id": r.reservation_id}
                ),
                compensate=ReleaseStock,
            )
        saga.remote(
            "reserve_credit",
            service="customers",
            command=ReserveCredit,
            reply=CreditReserved,
            on_reply=lambda d, r: d.model_copy(update={"credit_reservation_id": r.reservation_id}),
            compensate=ReleaseCredit,
        )
    saga.remote(  # a dead-lettered charge waits for the operator: replay it, or purge it
        "charge_payment",
        service="payments",
        command=ChargeCard,
        reply=CardCharged,
        on_reply=lambda d, r: d.model_copy(update={"charge_id": r.charge_id}),
        compensate=RefundCharge,
        on_dead_letter=CHARGE_ON_DEAD_LETTER,
    )
    saga.remote(  # the pivot: once shipment is scheduled, the order goes through
        "schedule_shipment",
        service="inventory",
        command=ScheduleShipment,
        reply=ShipmentScheduled,
        on_reply=lambda d, r: d.model_copy(update={"shipment_id": r.shipment_id}),
        pivot=True,
    )
    saga.local("approve_order")(approve_order)
    return saga


create_order_v1 = build_create_order(version=1)
create_order_v2 = build_create_order(version=2)
create_order_v3 = build_create_order(version=3)
#: The version new orders start on, by ``ORDERS_RESERVE``.
VERSIONS = {"sequential": create_order_v1, "parallel": create_order_v2, "lines": create_order_v3}
if RESERVE not in VERSIONS:
    raise ConfigurationError(f"ORDERS_RESERVE must be one of {sorted(VERSIONS)}, not {RESERVE!r}")
create_order = VERSIONS[RESERVE]

registry = SagaRegistry("orders")
registry.register(create_order_v1)
registry.register(create_order_v2)
registry.register(create_order_v3)
