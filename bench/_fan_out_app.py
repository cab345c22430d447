"""The saga ``bench.fan_out`` runs: one fan-out over the order's lines, then a confirmation.

Each line is a ``ReserveLine`` command to the ``stock`` service (its own database), which
records it and answers; the saga gathers the reserved quantity into its data. ``Confirm``
fails when the order says so, and the saga then releases every line. Started with
``saga consume bench._fan_out_app:registry`` and ``bench._fan_out_app:service``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from pydantic import BaseModel

from saga import HandlerContext, Saga, SagaRegistry, Service, StepFailed

#: The participant's one table: what it reserved and released.
TABLE = "CREATE TABLE IF NOT EXISTS public.lines (sku text NOT NULL, kind text NOT NULL)"


class Line(BaseModel):
    sku: str
    qty: int = 1


class Order(BaseModel):
    lines: list[Line]
    confirm_fails: bool = False
    reserved: int = 0


class ReserveLine(BaseModel):
    sku: str
    qty: int


class LineReserved(BaseModel):
    qty: int


class ReleaseLine(BaseModel):
    sku: str


class Confirm(BaseModel):
    confirm_fails: bool


order = Saga("fan_out_order", data=Order)
order.for_each(
    "reserve_lines",
    items=lambda d: d.lines,
    service="stock",
    command=lambda d, line: ReserveLine(sku=line.sku, qty=line.qty),
    reply=LineReserved,
    on_reply=lambda d, line, r: d.model_copy(update={"reserved": d.reserved + r.qty}),
    compensate=lambda d, line: ReleaseLine(sku=line.sku),
    max_in_flight=50,
    key=lambda line: line.sku,
)
order.remote("confirm", service="stock", command=Confirm)

registry = SagaRegistry("orders")
registry.register(order)

service = Service("stock")


def _record(tx: psycopg.Connection[Any], sku: str, kind: str) -> None:
    tx.execute("INSERT INTO public.lines (sku, kind) VALUES (%s, %s)", (sku, kind))


@service.handler(ReserveLine)
def reserve_line(
    tx: psycopg.Connection[Any], cmd: ReserveLine, ctx: HandlerContext
) -> LineReserved:
    _record(tx, cmd.sku, "reserve")
    return LineReserved(qty=cmd.qty)


@service.handler(ReleaseLine)
def release_line(tx: psycopg.Connection[Any], cmd: ReleaseLine, ctx: HandlerContext) -> None:
    _record(tx, cmd.sku, "release")


@service.handler(Confirm)
def confirm(tx: psycopg.Connection[Any], cmd: Confirm, ctx: HandlerContext) -> None:
    if cmd.confirm_fails:
        raise StepFailed("not confirmed")
