"""Orchestration on real PostgreSQL and RabbitMQ: paths, retries, cancel, idempotent start."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any
from uuid import UUID

import psycopg
import pytest
from pydantic import BaseModel

from saga import Saga, SagaRegistry
from saga.engine.state import Phase, SagaRecord, StepLogEntry
from saga.errors import (
    ConcurrentUpdate,
    ConfigurationError,
    IdempotencyKeyReused,
    NotCancellable,
)
from saga.messaging.control import Ack
from saga.messaging.envelope import Envelope
from saga.messaging.leases import Leases, leasing
from saga.messaging.outbox import OutgoingMessage
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.running import running_relay, running_service
from tests.support.sagas import EFFECTS_DDL, TripData, bank, registry, trip
from tests.support.wait import wait_until


@contextmanager
def trips_running(
    db: TestDatabase, broker: TestBroker, *, with_bank: bool = True
) -> Iterator[None]:
    with ExitStack() as stack:
        stack.enter_context(running_relay(db, broker))
        stack.enter_context(running_service(registry.as_service(), db, broker))
        if with_bank:
            stack.enter_context(running_service(bank, db, broker))
        yield


def start(db: TestDatabase, data: BaseModel, key: str | None = None) -> UUID:
    with db.connect(autocommit=False) as conn, conn.transaction():
        return trip.start(conn, data, idempotency_key=key)  # type: ignore[arg-type]


def status(db: TestDatabase, saga_id: UUID) -> str:
    return str(db.scalar("SELECT status FROM saga.saga_instances WHERE id = %s", (saga_id,)))


def settled(db: TestDatabase, saga_id: UUID, *statuses: str) -> str:
    return wait_until(
        lambda: (s := status(db, saga_id)) in statuses and s,
        timeout=30,
        what=f"saga in {statuses}",
    )


def effects(db: TestDatabase) -> list[str]:
    return [r[0] for r in db.rows("SELECT kind FROM effects ORDER BY id")]


def timeline(db: TestDatabase, saga_id: UUID) -> list[tuple[str, str, int, str]]:
    return [
        tuple(r)  # type: ignore[misc]
        for r in db.rows(
            "SELECT step, phase, attempt, outcome FROM saga.saga_steps "
            "WHERE saga_id = %s ORDER BY id",
            (saga_id,),
        )
    ]


@pytest.fixture(autouse=True)
def _effects_table(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)


def test_happy_path_completes_every_step_once(db: TestDatabase, rabbit: TestBroker) -> None:
    with trips_running(db, rabbit):
        saga_id = start(db, TripData(trip_id="t1"))
        assert settled(db, saga_id, "completed") == "completed"
    assert effects(db) == ["open", "charge", "book", "notify", "confirm"]
    assert [(s, o) for s, _, _, o in timeline(db, saga_id)] == [
        ("open_trip", "succeeded"),
        ("charge", "succeeded"),
        ("upgrade", "skipped"),
        ("book_hotel", "succeeded"),
        ("notify", "succeeded"),
        ("confirm", "succeeded"),
    ]
    data = db.scalar("SELECT data FROM saga.saga_instances WHERE id = %s", (saga_id,))
    assert data["charge_id"] == "ch-t1"


def test_conditional_step_runs_when_its_condition_holds(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    with trips_running(db, rabbit):
        saga_id = start(db, TripData(trip_id="vip", vip=True))
        settled(db, saga_id, "completed")
    assert "upgrade" in effects(db)


def test_failure_at_the_pivot_compensates_in_reverse_order(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    with trips_running(db, rabbit):
        saga_id = start(db, TripData(trip_id="t2", book_fails=True))
        assert settled(db, saga_id, "compensated", "compensation_failed") == "compensated"
    assert effects(db) == ["open", "charge", "refund", "close"]
    assert timeline(db, saga_id)[-3:] == [
        ("book_hotel", "forward", 1, "failed"),
        ("charge", "compensation", 1, "succeeded"),
        ("open_trip", "compensation", 1, "succeeded"),
    ]
    last_error = db.scalar("SELECT last_error FROM saga.saga_instances WHERE id = %s", (saga_id,))
    assert last_error == "book_hotel: no rooms"
    failures = db.rows("SELECT status, step, last_error FROM saga.saga_failures")
    assert failures == [("compensated", "book_hotel", "book_hotel: no rooms")]


def test_compensation_failing_three_times_then_succeeding(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    with trips_running(db, rabbit):
        saga_id = start(db, TripData(trip_id="t3", book_fails=True, refund_failures=3))
        assert settled(db, saga_id, "compensated", "compensation_failed") == "compensated"
    assert effects(db).count("refund") == 1
    assert effects(db).count("close") == 1
    refunds = [
        (a, o) for s, p, a, o in timeline(db, saga_id) if s == "charge" and p == "compensation"
    ]
    assert refunds == [(1, "failed"), (2, "failed"), (3, "failed"), (4, "succeeded")]
    assert db.scalar("SELECT count(*) FROM saga.dead_letters") == 0


def test_compensation_that_always_fails_is_visible_and_dead_lettered(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    with trips_running(db, rabbit):
        saga_id = start(db, TripData(trip_id="t4", book_fails=True, refund_failures=1000))
        assert settled(db, saga_id, "compensated", "compensation_failed") == "compensation_failed"
    row = db.rows(
        "SELECT step, last_error, finished_at IS NOT NULL FROM saga.saga_instances WHERE id = %s",
        (saga_id,),
    )[0]
    assert row[0] == "charge" and "refund refused" in row[1] and row[2]
    letters = db.rows("SELECT error_type, saga_id, attempts, error_message FROM saga.dead_letters")
    assert [(r[0], r[1], r[2]) for r in letters] == [("CompensationFailed", saga_id, 5)]
    assert "saga resume" in letters[0][3]
    assert "close" not in effects(db)  # compensation stops at the failing step


def test_step_after_the_pivot_is_retried_until_it_succeeds(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    with trips_running(db, rabbit):
        saga_id = start(db, TripData(trip_id="t5", notify_failures=2))
        assert settled(db, saga_id, "completed", "forward_failed") == "completed"
    assert effects(db).count("notify") == 1
    assert "refund" not in effects(db)


def test_step_after_the_pivot_that_never_succeeds_waits_for_an_operator(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    with trips_running(db, rabbit):
        saga_id = start(db, TripData(trip_id="t6", notify_failures=1000))
        assert settled(db, saga_id, "completed", "forward_failed") == "forward_failed"
    assert "refund" not in effects(db)  # never compensated after the pivot
    assert db.scalar("SELECT error_type FROM saga.dead_letters") == "ForwardStepFailed"


def test_starting_twice_with_the_same_key_gives_one_saga(db: TestDatabase) -> None:
    first = start(db, TripData(trip_id="t7"), key="request-42")
    second = start(db, TripData(trip_id="t7"), key="request-42")
    assert first == second
    assert db.scalar("SELECT count(*) FROM saga.saga_instances") == 1
    assert db.scalar("SELECT count(*) FROM saga.outbox WHERE message_type = 'Charge'") == 1
    assert effects(db) == ["open"]


def test_the_same_key_with_other_data_is_refused(db: TestDatabase) -> None:
    first = start(db, TripData(trip_id="t8"), key="request-43")
    with pytest.raises(IdempotencyKeyReused, match=f"'request-43' already started saga {first}"):
        start(db, TripData(trip_id="t8", book_fails=True), key="request-43")
    assert start(db, TripData(trip_id="t8"), key="request-43") == first
    assert db.scalar("SELECT count(*) FROM saga.saga_instances") == 1
    assert db.scalar("SELECT count(*) FROM saga.outbox WHERE message_type = 'Charge'") == 1
    assert effects(db) == ["open"]


def _remote_first() -> Saga[Basket]:
    checkout = Saga("checkout", data=Basket)
    checkout.remote("bill", service="billing", command=lambda d: Bill(basket_id=d.basket_id,
                                                                      customer="c"))  # fmt: skip
    SagaRegistry("shop").register(checkout)
    return checkout


@pytest.mark.parametrize("first_step", ["local", "remote"])
def test_a_start_racing_another_with_its_key_leaves_nothing_of_its_own(
    db: TestDatabase, first_step: str
) -> None:
    """The second of two starters with one key waits on the first's uncommitted row; once
    that commits, the second returns the first's saga and nothing it wrote is left: not
    its log, its messages or its local step's effects (the start writes them in the
    statement that finds the key taken)."""
    saga: Saga[Any] = trip if first_step == "local" else _remote_first()
    data = TripData(trip_id="t10") if first_step == "local" else Basket(basket_id="b2")
    counts = (
        "SELECT (SELECT count(*) FROM saga.saga_instances), (SELECT count(*) FROM saga.outbox), "
        "(SELECT count(*) FROM saga.saga_steps)"
    )
    with db.connect(autocommit=False) as first_conn, db.connect(autocommit=False) as second_conn:
        first_id = saga.start(first_conn, data, idempotency_key="request-44")
        alone = db.rows(counts)[0]  # nothing committed yet
        assert alone == (0, 0, 0)
        second: list[UUID] = []

        def start_again() -> None:
            second.append(saga.start(second_conn, data, idempotency_key="request-44"))

        racer = threading.Thread(target=start_again)
        racer.start()
        wait_until(
            lambda: db.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                (second_conn.info.backend_pid,),
            ),
            what="the second start waiting on the first's key",
        )
        first_conn.commit()
        once = db.rows(counts)[0]
        racer.join(30)
        assert second == [first_id]
        second_conn.commit()
    assert db.rows(counts)[0] == once
    assert effects(db) == (["open"] if first_step == "local" else [])


class Basket(BaseModel):
    basket_id: str
    customer: str | None = None


class Bill(BaseModel):
    basket_id: str
    customer: str


def test_a_command_that_cannot_be_built_at_start_names_saga_step_and_field(
    db: TestDatabase,
) -> None:
    checkout = Saga("checkout", data=Basket)
    checkout.remote(
        "bill",
        service="billing",
        command=lambda d: Bill(basket_id=d.basket_id, customer=d.customer),
    )
    SagaRegistry("shop").register(checkout)
    with pytest.raises(ConfigurationError) as info, db.connect() as conn, conn.transaction():
        checkout.start(conn, Basket(basket_id="b1"))
    assert str(info.value).startswith(
        "saga 'checkout' v1 step 'bill': cannot build its command Bill from Basket: "
        "customer: Input should be a valid string"
    )
    assert db.scalar("SELECT count(*) FROM saga.saga_instances") == 0


def test_start_is_atomic_with_the_callers_transaction(db: TestDatabase) -> None:
    with db.connect(autocommit=False) as conn, conn.transaction(force_rollback=True):
        trip.start(conn, TripData(trip_id="t8"))
    assert db.scalar("SELECT count(*) FROM saga.saga_instances") == 0
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0
    assert effects(db) == []


def test_cancel_compensates_once_the_pending_step_answers(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    saga_id = start(db, TripData(trip_id="t9"))
    with trips_running(db, rabbit, with_bank=False):
        wait_until(lambda: db.scalar("SELECT count(*) FROM saga.outbox") == 0, what="sent")
        with db.connect(autocommit=False) as conn, conn.transaction():
            registry.cancel(conn, saga_id, "customer changed their mind")
        with running_service(bank, db, rabbit):
            assert settled(db, saga_id, "compensated") == "compensated"
    assert effects(db) == ["open", "charge", "refund", "close"]
    last_error = db.scalar("SELECT last_error FROM saga.saga_instances WHERE id = %s", (saga_id,))
    assert last_error == "cancelled: customer changed their mind"


def test_cancel_is_refused_for_a_finished_saga(db: TestDatabase, rabbit: TestBroker) -> None:
    with trips_running(db, rabbit):
        saga_id = start(db, TripData(trip_id="t10"))
        settled(db, saga_id, "completed")
    with db.connect(autocommit=False) as conn, pytest.raises(NotCancellable, match="completed"):
        registry.cancel(conn, saga_id, "too late")


def test_reply_for_an_unknown_saga_is_retried_then_dead_lettered(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    stray = Envelope.wrap(Ack(), saga_id=UUID(int=1))
    with trips_running(db, rabbit, with_bank=False):
        rabbit.publish_raw("trips", stray.to_bytes(), "application/json")
        wait_until(
            lambda: db.scalar("SELECT count(*) FROM saga.dead_letters") == 1, what="dead letter"
        )
    row = db.rows("SELECT error_type, message_id, attempts FROM saga.dead_letters")[0]
    assert row == ("UnknownSaga", stray.message_id, 4)


@pytest.mark.parametrize("leased", [True, False], ids=["leased-one-statement", "unleased"])
def test_a_saga_written_from_a_stale_copy_is_refused(db: TestDatabase, leased: bool) -> None:
    """Two transitions of one saga read at the same version: the second one's write (the
    saga row with its step log and next message, in one statement when the messages are
    leased to a consumer) raises ConcurrentUpdate, and none of it commits."""
    saga_id = start(db, TripData(trip_id="stale"))
    home = registry.home
    with db.connect(autocommit=False) as conn:
        first, second = home.store.load(conn, saga_id), home.store.load(conn, saga_id)
        conn.rollback()
    assert first is not None and second is not None
    counts = "SELECT (SELECT count(*) FROM saga.outbox), (SELECT count(*) FROM saga.saga_steps)"
    before = db.rows(counts)[0]

    def write(conn: psycopg.Connection[Any], record: SagaRecord) -> None:
        entry = StepLogEntry(
            record.id, "book", Phase.FORWARD, 1, "succeeded", record.updated_at,
            record.updated_at,
        )  # fmt: skip
        note = OutgoingMessage(Envelope.wrap(Ack(), saga_id=record.id), "bank")
        with leasing(Leases()) if leased else nullcontext(), conn.transaction():
            home.persist(conn, [record], [entry], [note], [])

    with db.connect(autocommit=False) as conn:
        write(conn, first)
        with pytest.raises(ConcurrentUpdate, match="changed since they were read"):
            write(conn, second)
    assert db.rows(counts)[0] == (before[0] + 1, before[1] + 1)
