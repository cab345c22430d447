"""The payments service: charges cards and refunds charges."""

from __future__ import annotations

from typing import Any

import psycopg

from consumers import HandlerContext, Service, StepFailed
from examples.order_saga.flakiness import maybe_glitch
from examples.order_saga.messages import CardCharged, ChargeCard, RefundCharge

Tx = psycopg.Connection[Any]

service = Service("payments")

DECLINED = "tok_declined"


@service.handler(ChargeCard)
def charge_card(tx: Tx, cmd: ChargeCard, ctx: HandlerContext) -> CardCharged:
    maybe_glitch("charge_card")
    if cmd.card_token == DECLINED:
        raise StepFailed("card declined", code="declined")
    tx.execute(
        "INSERT INTO charges (id, order_id, amount_cents, status) VALUES (%s, %s, %s, 'charged')",
        (ctx.idempotency_key, cmd.order_id, cmd.amount_cents),
    )
    return CardCharged(charge_id=ctx.idempotency_key)


@service.handler(RefundCharge)
def refund_charge(tx: Tx, cmd: RefundCharge, ctx: HandlerContext) -> None:
    maybe_glitch("refund_charge")
    charged = tx.execute(
        "UPDATE charges SET status = 'refunded' WHERE id = %s AND status = 'charged' "
        "RETURNING order_id, amount_cents",
        (cmd.charge_id,),
    ).fetchone()
    if charged is not None:
        tx.execute(
            "INSERT INTO refunds (charge_id, order_id, amount_cents) VALUES (%s, %s, %s)",
            (cmd.charge_id, charged[0], charged[1]),
        )
