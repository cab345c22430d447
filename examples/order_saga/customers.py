"""The customers service: reserves and releases credit."""

from __future__ import annotations

from saga import HandlerContext, Service, StepFailed, Tx
from saga.examples.order_saga.flakiness import maybe_glitch
from saga.examples.order_saga.messages import CreditReserved, ReleaseCredit, ReserveCredit

service = Service("customers")


@service.handler(ReserveCredit)
def reserve_credit(tx: Tx, cmd: ReserveCredit, ctx: HandlerContext) -> CreditReserved:
    maybe_glitch("reserve_credit")
    row = tx.execute(
        "UPDATE credit SET available = available - %s "
        "WHERE customer_id = %s AND available >= %s RETURNING available",
        (cmd.amount_cents, cmd.customer_id, cmd.amount_cents),
    ).fetchone()
    if row is None:
        raise StepFailed(f"customer {cmd.customer_id} has insufficient credit", code="credit")
    tx.execute(
        "INSERT INTO credit_reservations (id, order_id, customer_id, amount_cents, status) "
        "VALUES (%s, %s, %s, %s, 'reserved')",
        (ctx.idempotency_key, cmd.order_id, cmd.customer_id, cmd.amount_cents),
    )
    return CreditReserved(reservation_id=ctx.idempotency_key)


@service.handler(ReleaseCredit)
def release_credit(tx: Tx, cmd: ReleaseCredit, ctx: HandlerContext) -> None:
    maybe_glitch("release_credit")
    row = tx.execute(
        "UPDATE credit_reservations SET status = 'released' "
        "WHERE id = %s AND status = 'reserved' RETURNING customer_id, amount_cents",
        (ctx.compensated_key,),  # the reservation's id is its step's key
    ).fetchone()
    if row is not None:  # already released: nothing to undo
        tx.execute(
            "UPDATE credit SET available = available + %s WHERE customer_id = %s",
            (row[1], row[0]),
        )
