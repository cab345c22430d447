"""The payments service: charges cards and refunds charges through an external gateway.

Each call goes through the side-effect guard with the step's idempotency key,
so a redelivered, retried or replayed command never charges twice, and the
gateway sees the same key every time (a refund has a key of its own).
"""

from __future__ import annotations

import functools
import os

from saga import HandlerContext, RetryPolicy, Service, StepFailed, Tx
from saga.examples.order_saga.flakiness import maybe_glitch
from saga.examples.order_saga.gateway import GatewayClient
from saga.examples.order_saga.messages import CardCharged, ChargeCard, RefundCharge


def _retry() -> RetryPolicy:
    """The default retries (about 70 s before a dead letter); ``PAYMENTS_RETRY_DELAYS``
    (seconds, e.g. "0.2,0.5") shortens the delayed ones for tests and demos."""
    delays = os.environ.get("PAYMENTS_RETRY_DELAYS")
    if not delays:
        return RetryPolicy()
    return RetryPolicy(delays=tuple(float(d) for d in delays.split(",")))


service = Service("payments", retry=_retry())


def gateway() -> GatewayClient:
    """The gateway of ``PAYMENT_GATEWAY_URL``: one client per URL, its connections kept open."""
    return _client(os.environ["PAYMENT_GATEWAY_URL"])


@functools.cache
def _client(url: str) -> GatewayClient:
    return GatewayClient(url)


@service.handler(ChargeCard)
def charge_card(tx: Tx, cmd: ChargeCard, ctx: HandlerContext) -> CardCharged:
    maybe_glitch("charge_card")
    key = ctx.idempotency_key
    charge = ctx.effects.run(
        key,
        call=lambda: gateway().charge(key, cmd.amount_cents, cmd.card_token),
        on_takeover=lambda: gateway().find_charge(key),  # did the dead worker's call land?
    )
    if charge["status"] == "declined":
        raise StepFailed("card declined", code="declined")
    tx.execute(
        "INSERT INTO charges (id, order_id, amount_cents, status, gateway_id) "
        "VALUES (%s, %s, %s, 'charged', %s)",
        (key, cmd.order_id, cmd.amount_cents, charge["id"]),
    )
    return CardCharged(charge_id=key)


@service.handler(RefundCharge)
def refund_charge(tx: Tx, cmd: RefundCharge, ctx: HandlerContext) -> None:
    maybe_glitch("refund_charge")
    charge_key = ctx.compensated_key  # a charge's id is its step's key
    charged = tx.execute(
        "UPDATE charges SET status = 'refunded' WHERE id = %s AND status = 'charged' "
        "RETURNING amount_cents, gateway_id",
        (charge_key,),
    ).fetchone()
    if charged is None:
        if (
            charge_key is None
            or tx.execute("SELECT 1 FROM charges WHERE id = %s", (charge_key,)).fetchone()
        ):
            return  # already refunded: nothing to undo
        # No charge recorded here, yet the gateway may have charged and lost its answer.
        found = gateway().find_charge(charge_key)
        if found is None or found["status"] != "succeeded":
            return  # the card was never charged: nothing to undo
        charged = (found["amount_cents"], found["id"])
        tx.execute(
            "INSERT INTO charges (id, order_id, amount_cents, status, gateway_id) "
            "VALUES (%s, %s, %s, 'refunded', %s)",
            (charge_key, cmd.order_id, *charged),
        )
    key = ctx.idempotency_key  # the compensation's own key, not the charge's
    ctx.effects.run(
        key,
        call=lambda: gateway().refund(key, charged[1]),
        on_takeover=lambda: gateway().find_refund(key),
    )
    tx.execute(
        "INSERT INTO refunds (charge_id, order_id, amount_cents) VALUES (%s, %s, %s)",
        (charge_key, cmd.order_id, charged[0]),
    )
