"""The orders service: home of the create_order saga (the whole flow is in this file).

It publishes ``OrderApproved`` when an order goes through and ``OrderRejected`` when it is
turned down, from the saga's local steps, in the orchestrator's transaction: the event
leaves only if the order's new status commits. Orders does not know who listens
(notifications and analytics do).
"""

from __future__ import annotations

import os
from contextlib import nullcontext

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


#: Publish OrderApproved and OrderRejected ("false" on a broker that carries commands only).
PUBLISH_EVENTS = os.environ.get("ORDERS_PUBLISH_EVENTS", "true") != "false"

#: What a dead-lettered charge means: "hold" the saga for the operator (replay the letter
#: to charge, purge it to compensate), or "compensate" at once, the charge included.
CHARGE_ON_DEAD_LETTER = os.environ.get("ORDERS_CHARGE_ON_DEAD_LETTER", "hold")

#: How new orders reserve stock and credit: "parallel" (version 2, both commands leave
#: together) or "sequential" (version 1, stock first, then credit), to measure one against
#: the other. Both versions stay registered, so sagas of either finish whatever the switch.
RESERVE = os.environ.get("ORDERS_RESERVE", "parallel")


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
    """The create_order saga; version 2 reserves stock and credit at once (a parallel
    group), version 1 one after the other. Nothing else differs."""
    saga = Saga("create_order", data=OrderData, version=version)
    saga.local("create_pending_order", compensate="reject_order")(create_pending_order)
    saga.local_compensation("reject_order")(reject_order)
    with saga.parallel("reserve") if version >= 2 else nullcontext():
        saga.remote(
            "reserve_stock",
            service="inventory",
            command=ReserveStock,
            reply=StockReserved,
            on_reply=lambda d, r: d.model_copy(update={"stock_reservation_id": r.reservation_id}),
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
#: The version new orders start on.
create_order = create_order_v1 if RESERVE == "sequential" else create_order_v2

registry = SagaRegistry("orders")
registry.register(create_order_v1)
registry.register(create_order_v2)
