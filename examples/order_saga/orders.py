"""The orders service: home of the create_order saga (the whole flow is in this file).

It publishes ``OrderApproved`` when an order goes through and ``OrderRejected`` when it is
turned down, from the saga's local steps, in the orchestrator's transaction: the event
leaves only if the order's new status commits. Orders does not know who listens
(notifications and analytics do).
"""

from __future__ import annotations

import os

from pydantic import BaseModel

from saga import Saga, SagaRegistry, Tx
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


class OrderData(BaseModel):
    order_id: str
    customer_id: str
    sku: str
    quantity: int
    amount_cents: int
    card_token: str
    region: str
    stock_reservation_id: str | None = None
    credit_reservation_id: str | None = None
    charge_id: str | None = None
    shipment_id: str | None = None


create_order = Saga("create_order", data=OrderData, version=1)

#: Publish OrderApproved and OrderRejected ("false" on a broker that carries commands only).
PUBLISH_EVENTS = os.environ.get("ORDERS_PUBLISH_EVENTS", "true") != "false"

#: What a dead-lettered charge means: "hold" the saga for the operator (replay the letter
#: to charge, purge it to compensate), or "compensate" at once, the charge included.
CHARGE_ON_DEAD_LETTER = os.environ.get("ORDERS_CHARGE_ON_DEAD_LETTER", "hold")


@create_order.local("create_pending_order", compensate="reject_order")
def create_pending_order(tx: Tx, d: OrderData) -> None:
    # The HTTP front door (http_api.py) writes the row in the transaction that starts the saga.
    tx.execute(
        "INSERT INTO orders (id, customer_id, amount_cents, status) VALUES (%s, %s, %s, 'pending') "
        "ON CONFLICT (id) DO NOTHING",
        (d.order_id, d.customer_id, d.amount_cents),
    )


@create_order.local_compensation("reject_order")
def reject_order(tx: Tx, d: OrderData) -> None:
    tx.execute("UPDATE orders SET status = 'rejected' WHERE id = %s", (d.order_id,))
    if PUBLISH_EVENTS:
        registry.outbox.publish(tx, OrderRejected(order_id=d.order_id, customer_id=d.customer_id))


create_order.remote(
    "reserve_stock",
    service="inventory",
    command=ReserveStock,
    reply=StockReserved,
    on_reply=lambda d, r: d.model_copy(update={"stock_reservation_id": r.reservation_id}),
    compensate=ReleaseStock,
)
create_order.remote(
    "reserve_credit",
    service="customers",
    command=ReserveCredit,
    reply=CreditReserved,
    on_reply=lambda d, r: d.model_copy(update={"credit_reservation_id": r.reservation_id}),
    compensate=ReleaseCredit,
)
create_order.remote(  # a dead-lettered charge waits for the operator: replay it, or purge it
    "charge_payment",
    service="payments",
    command=ChargeCard,
    reply=CardCharged,
    on_reply=lambda d, r: d.model_copy(update={"charge_id": r.charge_id}),
    compensate=RefundCharge,
    on_dead_letter=CHARGE_ON_DEAD_LETTER,
)
create_order.remote(  # the pivot: once shipment is scheduled, the order goes through
    "schedule_shipment",
    service="inventory",
    command=ScheduleShipment,
    reply=ShipmentScheduled,
    on_reply=lambda d, r: d.model_copy(update={"shipment_id": r.shipment_id}),
    pivot=True,
)


@create_order.local("approve_order")
def approve_order(tx: Tx, d: OrderData) -> None:
    tx.execute("UPDATE orders SET status = 'approved' WHERE id = %s", (d.order_id,))
    if PUBLISH_EVENTS:
        approved = OrderApproved(
            order_id=d.order_id, customer_id=d.customer_id, amount_cents=d.amount_cents
        )
        registry.outbox.publish(tx, approved)


registry = SagaRegistry("orders")
registry.register(create_order)
