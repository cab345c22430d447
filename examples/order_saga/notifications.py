"""The notifications service: one notice per order decided, approved or rejected.

It subscribes to the events orders publishes; orders knows nothing of it. Each notice is
a row of its own database, written in the transaction that handles the event, once.
"""

from __future__ import annotations

from saga import HandlerContext, Service, Tx
from saga.examples.order_saga.flakiness import maybe_glitch
from saga.examples.order_saga.messages import OrderApproved, OrderRejected

service = Service("notifications")


def _notice(tx: Tx, order_id: str, customer_id: str, kind: str) -> None:
    tx.execute(
        "INSERT INTO notices (order_id, customer_id, kind) VALUES (%s, %s, %s)",
        (order_id, customer_id, kind),
    )


@service.subscribe(OrderApproved)
def order_approved(tx: Tx, event: OrderApproved, ctx: HandlerContext) -> None:
    maybe_glitch("notify_approved")
    _notice(tx, event.order_id, event.customer_id, "approved")


@service.subscribe(OrderRejected)
def order_rejected(tx: Tx, event: OrderRejected, ctx: HandlerContext) -> None:
    maybe_glitch("notify_rejected")
    _notice(tx, event.order_id, event.customer_id, "rejected")
