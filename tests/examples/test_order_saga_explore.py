"""The order saga explored under every schedule of failures Hypothesis draws (h.explore).

Inventory and customers run for real; payments is stubbed by rules. The
invariant is the order's promise: an approved order holds its stock and credit,
a rejected one holds neither, and only a saga waiting for its operator may keep
them in between. A compensation planted with a classic bug (it refuses to undo
what was never done) is found and replayed as a plain harness test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from uuid import UUID

import pytest

from saga import HandlerContext, Service, StepFailed, Tx
from saga.examples.order_saga import customers, inventory, messages
from saga.examples.order_saga.messages import CardCharged, ChargeCard, RefundCharge, ReleaseCredit
from saga.examples.order_saga.orders import OrderData, OrderLine, create_order, registry
from saga.testing import Fail, SagaHarness

SCHEMA = sorted((Path(customers.__file__).parent / "schema").glob("*.sql"))
ORDER = OrderData(order_id="o1", customer_id="c1", sku="sku-1", quantity=2, amount_cents=500,
                  card_token="tok", region="eu")  # fmt: skip


def seed(h: SagaHarness) -> None:
    with h.transaction() as tx:
        tx.execute("INSERT INTO stock VALUES ('sku-1', 10, 10)")
        tx.execute("INSERT INTO credit VALUES ('c1', 1000, 1000)")


def nothing_held_unless_approved(h: SagaHarness, saga_id: UUID) -> None:
    status = h.status(saga_id)
    if status == "step_dead_lettered":
        return  # the charge's dead letter waits for the operator: the reservations stay
    held = (h.rows("SELECT available FROM stock"), h.rows("SELECT available FROM credit"),
            h.rows("SELECT status FROM orders"))  # fmt: skip
    if status == "completed":
        assert held == ([(8,)], [(500,)], [("approved",)]), held
    else:
        assert (status, held) == ("compensated", ([(10,)], [(1000,)], [("rejected",)])), held


def harness(saga_harness, customers_service: Service) -> SagaHarness:
    h: SagaHarness = saga_harness(registry, services=[inventory.service, customers_service],
                                  schema=SCHEMA)  # fmt: skip
    h.on("payments", ChargeCard, CardCharged(charge_id="ch-1"))
    h.on("payments", RefundCharge, CardCharged(charge_id="-"))
    seed(h)
    return h


def test_the_order_saga_keeps_its_promise_under_every_schedule(saga_harness) -> None:
    h = harness(saga_harness, customers.service)
    h.explore(create_order, ORDER, nothing_held_unless_approved, setup=seed)


def refusing_release(tx: Tx, cmd: ReleaseCredit, ctx: HandlerContext) -> None:
    """The planted bug: a release with nothing to release is an error (the reservation never
    happened when the credit step was dead-lettered), so the compensation never ends."""
    row = tx.execute(
        "UPDATE credit_reservations SET status = 'released' "
        "WHERE id = %s AND status = 'reserved' RETURNING customer_id, amount_cents",
        (ctx.compensated_key,),
    ).fetchone()
    if row is None:
        raise LookupError(f"no credit reservation {ctx.compensated_key} to release")
    tx.execute("UPDATE credit SET available = available + %s WHERE customer_id = %s",
               (row[1], row[0]))  # fmt: skip


def customers_with_a_refusing_release() -> Service:
    planted = Service("customers", retry=customers.service.retry)
    spec = customers.service.handler_for("ReserveCredit")
    assert spec is not None
    planted.add_handler(spec.message_class, spec.func, retry=spec.retry)
    planted.add_handler(ReleaseCredit, refusing_release)
    return planted


def test_explore_finds_a_compensation_that_refuses_to_undo_nothing(saga_harness) -> None:
    h = harness(saga_harness, customers_with_a_refusing_release())

    with pytest.raises(AssertionError) as raised:
        h.explore(create_order, ORDER, nothing_held_unless_approved, setup=seed)

    [report] = [n for n in raised.value.__notes__ if n.startswith("explore:")]
    assert "#   customers ReserveCredit #1: dead-lettered" in report, report
    test_source = report[report.index("def test_explored_schedule") :]
    assert "h.fail_transiently('customers', ReserveCredit, times=1_000_000)" in test_source
    replay = replayed(test_source)
    with pytest.raises(AssertionError):  # the printed test fails on the planted bug...
        replay(harness(saga_harness, customers_with_a_refusing_release()))
    replay(harness(saga_harness, customers.service))  # ...and passes on the example's own


def replayed(test_source: str) -> Callable[[SagaHarness], None]:
    """The test explore printed, defined as the user would paste it into this module."""
    namespace = {**globals(), **vars(messages), "StepFailed": StepFailed, "Fail": Fail,
                 "OrderLine": OrderLine}  # fmt: skip
    exec(test_source, namespace)
    test: Callable[[SagaHarness], None] = namespace["test_explored_schedule"]
    return test
