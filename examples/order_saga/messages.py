"""The messages the four services exchange (shared by all of them)."""

from __future__ import annotations

from pydantic import BaseModel


class ReserveStock(BaseModel):
    order_id: str
    sku: str
    quantity: int


class StockReserved(BaseModel):
    reservation_id: str


class ReleaseStock(BaseModel):
    reservation_id: str


class ReserveCredit(BaseModel):
    order_id: str
    customer_id: str
    amount_cents: int


class CreditReserved(BaseModel):
    reservation_id: str


class ReleaseCredit(BaseModel):
    reservation_id: str


class ChargeCard(BaseModel):
    order_id: str
    amount_cents: int
    card_token: str


class CardCharged(BaseModel):
    charge_id: str


class RefundCharge(BaseModel):
    charge_id: str


class ScheduleShipment(BaseModel):
    order_id: str
    stock_reservation_id: str
    region: str


class ShipmentScheduled(BaseModel):
    shipment_id: str
