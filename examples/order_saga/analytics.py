"""The analytics service: how many orders each customer had approved, and for how much.

A running total per customer, added to in the transaction that handles each
``OrderApproved``: an event handled twice would show as a total too high.
"""

from __future__ import annotations

from saga import HandlerContext, Service, Tx
from saga.examples.order_saga.flakiness import maybe_glitch
from saga.examples.order_saga.messages import OrderApproved

service = Service("analytics")


@service.subscribe(OrderApproved)
def count_approved(tx: Tx, event: OrderApproved, ctx: HandlerContext) -> None:
    maybe_glitch("count_approved")
    tx.execute(
        "INSERT INTO approved_totals (customer_id, orders, amount_cents) VALUES (%s, 1, %s) "
        "ON CONFLICT (customer_id) DO UPDATE SET orders = approved_totals.orders + 1, "
        "amount_cents = approved_totals.amount_cents + excluded.amount_cents",
        (event.customer_id, event.amount_cents),
    )
