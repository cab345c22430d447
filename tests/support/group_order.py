"""An order whose stock and credit are reserved at once, in a parallel group.

The saga the unit tests of parallel groups and of late successes drive event by event:
one definition, so that what the group tests show (members sent together, gathered,
compensated) and what the late-success tests build on are the same saga.
"""

from __future__ import annotations

from pydantic import BaseModel

from saga import Saga, StepRetry


class Order(BaseModel):
    stock: str | None = None
    credit: str | None = None


class Reserve(BaseModel):
    what: str


class Reserved(BaseModel):
    reference: str = ""


class Release(BaseModel):
    what: str
    reference: str | None = None


def order_saga(*, pivot: bool = False, retry: StepRetry | None = None) -> Saga[Order]:
    """Create the order, then reserve stock and credit in group ``reserve``, then charge.

    ``pivot`` makes the credit reservation the pivot (refused inside a group); the credit's
    release names the reference its reservation answered with.
    """
    saga = Saga("order", data=Order, retry=retry)
    saga.remote("create", service="orders", command=lambda d: Reserve(what="order"),
                compensate=lambda d: Release(what="order"))  # fmt: skip
    with saga.parallel("reserve"):
        saga.remote(
            "reserve_stock",
            service="inventory",
            command=lambda d: Reserve(what="stock"),
            reply=Reserved,
            on_reply=lambda d, r: d.model_copy(update={"stock": r.reference}),
            compensate=lambda d: Release(what="stock"),
        )
        saga.remote(
            "reserve_credit",
            service="customers",
            command=lambda d: Reserve(what="credit"),
            reply=Reserved,
            on_reply=lambda d, r: d.model_copy(update={"credit": r.reference}),
            compensate=lambda d: Release(what="credit", reference=d.credit),
            pivot=pivot,
        )
    saga.remote("charge", service="payments", command=lambda d: Reserve(what="charge"))
    return saga
