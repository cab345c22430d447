"""The inventory service: reserves and releases stock, schedules shipments."""

from __future__ import annotations

from saga import HandlerContext, Service, StepFailed, Tx
from saga.examples.order_saga.flakiness import maybe_glitch
from saga.examples.order_saga.messages import (
    ReleaseStock,
    ReserveStock,
    ScheduleShipment,
    ShipmentScheduled,
    StockReserved,
)

service = Service("inventory")


@service.handler(ReserveStock)
def reserve_stock(tx: Tx, cmd: ReserveStock, ctx: HandlerContext) -> StockReserved:
    maybe_glitch("reserve_stock")
    row = tx.execute(
        "UPDATE stock SET available = available - %s WHERE sku = %s AND available >= %s "
        "RETURNING available",
        (cmd.quantity, cmd.sku, cmd.quantity),
    ).fetchone()
    if row is None:
        raise StepFailed(f"not enough {cmd.sku} in stock for {cmd.quantity}", code="stock")
    tx.execute(
        "INSERT INTO stock_reservations (id, order_id, sku, quantity, status) "
        "VALUES (%s, %s, %s, %s, 'reserved')",
        (ctx.idempotency_key, cmd.order_id, cmd.sku, cmd.quantity),
    )
    return StockReserved(reservation_id=ctx.idempotency_key)


@service.handler(ReleaseStock)
def release_stock(tx: Tx, cmd: ReleaseStock, ctx: HandlerContext) -> None:
    maybe_glitch("release_stock")
    row = tx.execute(
        "UPDATE stock_reservations SET status = 'released' "
        "WHERE id = %s AND status = 'reserved' RETURNING sku, quantity",
        (ctx.compensated_key,),  # the reservation's id is its step's key
    ).fetchone()
    if row is not None:
        tx.execute("UPDATE stock SET available = available + %s WHERE sku = %s", (row[1], row[0]))


@service.handler(ScheduleShipment)
def schedule_shipment(tx: Tx, cmd: ScheduleShipment, ctx: HandlerContext) -> ShipmentScheduled:
    maybe_glitch("schedule_shipment")
    if tx.execute("SELECT 1 FROM closed_regions WHERE region = %s", (cmd.region,)).fetchone():
        raise StepFailed(f"no shipping to {cmd.region}", code="region")
    tx.execute(
        "INSERT INTO shipments (id, order_id, reservation_id, region) VALUES (%s, %s, %s, %s)",
        (ctx.idempotency_key, cmd.order_id, cmd.stock_reservation_id, cmd.region),
    )
    if cmd.stock_reservation_id is not None:
        tx.execute(
            "UPDATE stock_reservations SET status = 'shipped' WHERE id = %s",
            (cmd.stock_reservation_id,),
        )
    else:  # every line's reservation (a line released by a late success stays released)
        tx.execute(
            "UPDATE stock_reservations SET status = 'shipped' "
            "WHERE order_id = %s AND status = 'reserved'",
            (cmd.order_id,),
        )
    return ShipmentScheduled(shipment_id=ctx.idempotency_key)
