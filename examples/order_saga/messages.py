"""The messages the services exchange (shared by all of them): commands and replies
between the order saga and its participants, and the events orders publishes.

Compensations carry the order, not ids from the forward step's reply: that reply
may never have come (the command was dead-lettered or timed out, its outcome
unknown). The participant finds what to undo by the step's key
(``ctx.compensated_key``), and finds nothing when the command never ran.
"""

from __future__ import annotations

from pydantic import BaseModel


class ReserveStock(BaseModel):
    order_id: str
    sku: str
    quantity: int


class StockReserved(BaseModel):
    reservation_id: str


class ReleaseStock(BaseModel):
    order_id: str


class ReserveCredit(BaseModel):
    order_id: str
    customer_id: str
    amount_cents: int


class CreditReserved(BaseModel):
    reservation_id: str


class ReleaseCredit(BaseModel):
    order_id: str


class ChargeCard(BaseModel):
    order_id: str
    amount_cents: int
    card_token: str


class CardCharged(BaseModel):
    charge_id: str


class RefundCharge(BaseModel):
    order_id: str


class ScheduleShipment(BaseModel):
    """Ship the order's reserved stock: the one reservation named (an order of one sku,
    create_order versions 1 and 2), or, with none named, every reservation the order holds
    (version 3: one per line)."""

    order_id: str
    stock_reservation_id: str | None = None
    region: str


class ShipmentScheduled(BaseModel):
    shipment_id: str


# -- events: published by orders, to whoever subscribes ---------------------------------


class OrderApproved(BaseModel):
    """Published by orders when an order goes through (its saga's last step)."""

    order_id: str
    customer_id: str
    amount_cents: int


class OrderRejected(BaseModel):
    """Published by orders when an order is turned down (its saga compensated)."""

    order_id: str
    customer_id: str
