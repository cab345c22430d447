"""A saga's wait step ends on a published event correlated by a key in its payload.

The saga asks payments to take the money, then waits for ``PaymentSettled`` for its
order; payments publishes it (``ctx.publish``) in the transaction that answers the
command, so the event may come before the saga waits: it is kept, and ends the wait as
soon as it begins. Run in saga.testing's harness (real PostgreSQL, virtual clock), and
through the consumer's batches for the races.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

from saga import HandlerContext, Outbox, RetryPolicy, Saga, SagaRegistry, Service, Tx
from saga.consumers import Delivery, DeliveryBatchProcessor, DeliveryOutcome
from saga.errors import ConfigurationError, StepFailed
from saga.messaging.envelope import Envelope
from saga.operations.retention import Pruner
from saga.testing import SagaHarness
from tests.support.databases import TestDatabase
from tests.support.services import EFFECTS_DDL
from tests.support.wait import wait_until

JSON = "application/json"
LOCK_WAITS = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"


class Shipment(BaseModel):
    order_id: str
    publish_settlement: bool = True
    settled_ref: str | None = None


class TakePayment(BaseModel):
    order_id: str
    publish_settlement: bool


class PaymentSettled(BaseModel):
    order_id: str
    ref: str


shipping = Saga("shipping", data=Shipment)
shipping.remote("take_payment", service="payments", command=TakePayment)
shipping.wait(
    "settlement",
    event=PaymentSettled,
    correlate=lambda d: d.order_id,
    event_key="order_id",
    timeout=timedelta(hours=1),
    on_event=lambda d, e: d.model_copy(update={"settled_ref": e.ref}),
)


@shipping.local("ship")
def ship(tx: Tx, d: Shipment) -> None:
    tx.execute("INSERT INTO public.effects (kind, key) VALUES ('shipped', %s)", (d.order_id,))


class Receipt(BaseModel):
    ref: str


#: Waits for the same event under another of its fields: the settlement's reference.
receipts = Saga("receipts", data=Receipt)
receipts.wait("settled", event=PaymentSettled, correlate=lambda d: d.ref, event_key="ref")


def _unless_bounced(d: Shipment, e: PaymentSettled) -> Shipment:
    if e.ref == "bounced":
        raise StepFailed("the settlement bounced")
    return d.model_copy(update={"settled_ref": e.ref})


#: Its wait is past the pivot: a settlement it refuses leaves it waiting for the next one.
prepaid = Saga("prepaid", data=Shipment)
prepaid.remote("take_payment", service="payments", command=TakePayment, pivot=True)
prepaid.wait(
    "settlement",
    event=PaymentSettled,
    correlate=lambda d: d.order_id,
    event_key="order_id",
    on_event=_unless_bounced,
)

registry = SagaRegistry("shipping", retry=RetryPolicy(immediate_attempts=1, delays=(60,)))
registry.register(shipping)
registry.register(receipts)
registry.register(prepaid)

payments = Service("payments")


@payments.handler(TakePayment)
def take_payment(tx: Tx, command: TakePayment, ctx: HandlerContext) -> None:
    if command.publish_settlement:  # written before the reply: it reaches the saga first
        ctx.publish(PaymentSettled(order_id=command.order_id, ref=f"ref-{command.order_id}"))


def settle(h: SagaHarness, order_id: str, ref: str = "late") -> None:
    """Publish a settlement as another service would, in a transaction of its own."""
    with h.transaction() as tx:
        Outbox().publish(tx, PaymentSettled(order_id=order_id, ref=ref))
    h.run_until_idle()


@pytest.fixture
def h(saga_harness: Any) -> SagaHarness:
    harness: SagaHarness = saga_harness(registry, services=[payments], schema=[EFFECTS_DDL])
    return harness


def test_the_home_service_subscribes_to_the_events_its_sagas_wait_for() -> None:
    assert registry.awaited_events == ["PaymentSettled"]  # once, for both sagas
    assert registry.as_service().subscriptions == ["PaymentSettled"]


def test_an_event_that_comes_before_the_wait_ends_it_as_soon_as_it_begins(
    h: SagaHarness,
) -> None:
    saga_id = h.start(shipping, Shipment(order_id="o1"))
    h.run_until_idle()
    assert h.status(saga_id) == "completed"
    assert h.data(saga_id) == Shipment(order_id="o1", settled_ref="ref-o1")
    kept = h.rows("SELECT correlation_key FROM saga.early_events")
    assert kept == [("ref-o1",)]  # its order's copy taken; its reference's kept for receipts
    h.assert_published(PaymentSettled(order_id="o1", ref="ref-o1"))
    assert h.steps(saga_id) == ["take_payment succeeded", "settlement succeeded", "ship succeeded"]


def test_a_kept_event_the_wait_refuses_is_dropped_and_the_next_kept_one_ends_it(
    h: SagaHarness,
) -> None:
    saga_id = h.start(prepaid, Shipment(order_id="p1", publish_settlement=False))
    with h.transaction() as tx:  # both come before the payment's reply: kept, in this order
        Outbox().publish(tx, PaymentSettled(order_id="p1", ref="bounced"))
        Outbox().publish(tx, PaymentSettled(order_id="p1", ref="r-1"))
    h.run_until_idle()
    assert h.status(saga_id) == "completed"
    assert h.data(saga_id).settled_ref == "r-1"
    assert h.steps(saga_id) == [
        "take_payment succeeded",
        "early event PaymentSettled ignored",
        "settlement succeeded",
    ]
    assert h.rows("SELECT 1 FROM saga.early_events WHERE correlation_key = 'p1'") == []


def test_the_event_for_its_key_ends_the_wait_and_others_do_not(h: SagaHarness) -> None:
    saga_id = h.start(shipping, Shipment(order_id="o2", publish_settlement=False))
    h.run_until_idle()
    assert (h.status(saga_id), h.step(saga_id)) == ("running", "settlement")
    assert h.record(saga_id).wait_key == "o2"

    settle(h, "someone-else")
    assert h.step(saga_id) == "settlement"  # not its key: still waiting, the event kept
    kept = h.rows("SELECT correlation_key FROM saga.early_events ORDER BY 1")
    assert kept == [("late",), ("someone-else",)]  # under each key it carries

    settle(h, "o2", ref="r-2")
    assert h.status(saga_id) == "completed"
    assert h.data(saga_id) == Shipment(order_id="o2", publish_settlement=False, settled_ref="r-2")
    assert h.record(saga_id).wait_key is None

    settle(h, "o2", ref="again")  # a second settlement finds no saga waiting: kept, harmless
    assert h.status(saga_id) == "completed"
    assert h.rows("SELECT count(*) FROM public.effects WHERE kind = 'shipped'") == [(1,)]


def test_an_event_ends_a_wait_only_under_the_key_that_wait_reads_from_it(h: SagaHarness) -> None:
    """The event carries two keys (its order id for shipping, its reference for receipts):
    a shipping saga waiting under a value that is the event's reference is not its saga."""
    shipment = h.start(shipping, Shipment(order_id="r-1", publish_settlement=False))
    receipt = h.start(receipts, Receipt(ref="r-1"))
    h.run_until_idle()
    settle(h, "o-other", ref="r-1")  # reference r-1, order o-other
    assert h.status(receipt) == "completed"
    assert (h.status(shipment), h.step(shipment)) == ("running", "settlement")
    kept = h.rows("SELECT correlation_key FROM saga.early_events")
    assert kept == [("o-other",)]  # kept under the key no saga waited for, not the other


def test_every_saga_waiting_under_the_key_gets_the_event(h: SagaHarness) -> None:
    first = h.start(shipping, Shipment(order_id="o3", publish_settlement=False))
    second = h.start(shipping, Shipment(order_id="o3", publish_settlement=False))
    h.run_until_idle()
    settle(h, "o3")
    assert (h.status(first), h.status(second)) == ("completed", "completed")
    assert h.rows("SELECT count(*) FROM saga.early_events WHERE correlation_key = 'o3'") == [(0,)]


def test_no_event_within_the_timeout_compensates(h: SagaHarness) -> None:
    saga_id = h.start(shipping, Shipment(order_id="o4", publish_settlement=False))
    h.advance(timedelta(hours=2))
    assert h.status(saga_id) == "compensated"
    settle(h, "o4")  # too late: no saga waits; kept for nobody, nothing changes
    assert h.status(saga_id) == "compensated"


def test_a_signal_still_ends_a_wait_for_an_event(h: SagaHarness) -> None:
    saga_id = h.start(shipping, Shipment(order_id="o5", publish_settlement=False))
    h.run_until_idle()
    h.signal(saga_id, "PaymentSettled", {"order_id": "o5", "ref": "by-hand"})
    h.run_until_idle()
    assert h.status(saga_id) == "completed"
    assert h.data(saga_id).model_dump()["settled_ref"] == "by-hand"


def test_a_wait_for_an_event_must_say_how_to_correlate() -> None:
    saga = Saga("bad", data=Shipment)
    with pytest.raises(ConfigurationError, match=r"correlate= .* and event_key="):
        saga.wait("w", event=PaymentSettled)
    with pytest.raises(ConfigurationError, match="need a published event's class"):
        saga.wait("w", event="settled", payload=PaymentSettled, correlate=lambda d: d.order_id)


# -- through the consumer's batches, on two connections ---------------------------------


def _take(db: TestDatabase, destination: str | None) -> list[Delivery]:
    rows = db.rows(
        "DELETE FROM saga.outbox WHERE destination IS NOT DISTINCT FROM %s RETURNING id, body",
        (destination,),
    )
    return [Delivery(bytes(body), JSON) for _, body in sorted(rows)]


def _reply_waiting(db: TestDatabase, order_id: str) -> list[Delivery]:
    """Start a saga and let payments answer (no settlement): the reply, not yet handled."""
    with db.connect(autocommit=False) as conn, conn.transaction():
        shipping.start(conn, Shipment(order_id=order_id, publish_settlement=False))
    with psycopg.connect(db.url) as conn:
        DeliveryBatchProcessor(payments).process(conn, _take(db, "payments"))
    return _take(db, "shipping")


def _settlement(order_id: str) -> Delivery:
    event = Envelope.wrap(PaymentSettled(order_id=order_id, ref="batched"))
    return Delivery(event.to_bytes(), JSON)


def _status(db: TestDatabase, order_id: str) -> tuple[str, str | None]:
    rows = db.rows(
        "SELECT status, step FROM saga.saga_instances WHERE data->>'order_id' = %s", (order_id,)
    )
    return rows[0]


def test_in_one_batch_the_reply_begins_the_wait_and_the_event_behind_it_ends_it(
    db: TestDatabase,
) -> None:
    db.execute(EFFECTS_DDL)
    (reply,) = _reply_waiting(db, "b1")
    with psycopg.connect(db.url) as conn:
        outcomes = DeliveryBatchProcessor(registry.as_service()).process(
            conn, [reply, _settlement("b1")]
        )
    assert outcomes == [DeliveryOutcome.HANDLED, DeliveryOutcome.HANDLED]
    assert _status(db, "b1") == ("completed", None)
    assert db.scalar("SELECT count(*) FROM saga.early_events WHERE correlation_key = 'b1'") == 0


@pytest.mark.parametrize("held_first", ["reply", "event"])
def test_a_wait_and_its_event_committing_at_once_never_miss_each_other(
    db: TestDatabase, held_first: str
) -> None:
    """Neither transaction sees what the other has not committed: the event's would keep
    the event for a saga that looked already, the saga's would wait for an event kept
    out of its sight. The lock on (type, key) makes the second wait for the first's
    commit, then see it: the reply's transaction takes the kept event, or the event's
    finds the saga waiting."""
    db.execute(EFFECTS_DDL)
    (reply,) = _reply_waiting(db, "race")
    first, second = (reply, _settlement("race"))
    if held_first == "event":
        first, second = second, first
    service = registry.as_service()
    outcomes: list[DeliveryOutcome] = []

    def handle_second() -> None:
        with psycopg.connect(db.url) as conn:
            outcomes.extend(DeliveryBatchProcessor(service).process(conn, [second]))

    with db.connect(autocommit=False) as holding, holding.transaction():
        DeliveryBatchProcessor(service).process(holding, [first])  # done, not committed
        thread = threading.Thread(target=handle_second)
        thread.start()
        wait_until(
            lambda: db.scalar(LOCK_WAITS), what="the second transaction waiting for the lock"
        )
    thread.join(30)
    assert outcomes == [DeliveryOutcome.HANDLED]
    assert _status(db, "race") == ("completed", None)
    assert db.scalar("SELECT count(*) FROM saga.early_events WHERE correlation_key = 'race'") == 0


def test_events_kept_past_their_retention_are_pruned(db: TestDatabase) -> None:
    db.execute(
        "INSERT INTO saga.early_events (message_type, correlation_key, message_id, payload, "
        "received_at) VALUES ('PaymentSettled', 'old', gen_random_uuid(), '{}', "
        "now() - interval '8 days'), ('PaymentSettled', 'new', gen_random_uuid(), '{}', now())"
    )
    with db.connect(autocommit=False) as conn:
        report = Pruner("saga").prune(conn)
    assert report.deleted["early_events"] == 1
    assert db.rows("SELECT correlation_key FROM saga.early_events") == [("new",)]
