"""An order of lines, and the messages a fan-out over its lines sends.

The unit tests of fan-outs, alone and inside a parallel group, build their sagas from
these; each keeps its own line reservation (what it carries is what those tests assert).
"""

from __future__ import annotations

from pydantic import BaseModel


class Line(BaseModel):
    sku: str
    qty: int


class Order(BaseModel):
    lines: list[Line] = []
    reserved: dict[str, str] = {}
    credit: str | None = None  # reserved beside the lines, when a group does


class ReleaseLine(BaseModel):
    sku: str


class CreateOrder(BaseModel):
    pass


class CancelOrder(BaseModel):
    pass


def lines(*skus: str) -> Order:
    """An order of one of each of ``skus``."""
    return Order(lines=[Line(sku=s, qty=1) for s in skus])
