"""The async twins of the writing side on real PostgreSQL (and RabbitMQ where sagas run).

``Outbox.add_async``, ``SagaRegistry.start_async``, ``signal_async`` and
``cancel_async`` write what their synchronous namesakes write, in the caller's
``psycopg.AsyncConnection`` transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from typing import Any, TypeVar
from uuid import UUID

import psycopg
import pytest
from pydantic import BaseModel

from saga import Outbox
from saga.errors import IdempotencyKeyReused, NotCancellable, SignalRejected, UnknownSaga
from saga.messaging.envelope import Envelope
from saga.messaging.leases import Leases, leasing
from saga.messaging.outbox import OutgoingMessage
from saga.operations.resume import SagaResumer
from tests.support import loans
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase, wake_hints
from tests.support.running import running_relay, running_service
from tests.support.services import EFFECTS_DDL
from tests.support.wait import wait_until

T = TypeVar("T")
AsyncWork = Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]
registry = loans.registry_v1


class Note(BaseModel):
    text: str


def in_async_tx(
    db: TestDatabase, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]
) -> T:
    """Run ``work`` in one committed transaction on a fresh async connection."""

    async def run() -> T:
        conn = await psycopg.AsyncConnection.connect(db.url)
        async with conn, conn.transaction():
            return await work(conn)

    return asyncio.run(run())


def outbox_rows(db: TestDatabase) -> list[tuple[Any, ...]]:
    return db.rows("SELECT id, destination, message_type, saga_id FROM saga.outbox ORDER BY id")


# -- Outbox.add_async --------------------------------------------------------------


def test_add_async_writes_the_row_add_writes(db: TestDatabase) -> None:
    message_id = in_async_tx(
        db, lambda conn: Outbox().add_async(conn, Note(text="a"), destination="notes")
    )
    with db.connect(autocommit=False) as conn, conn.transaction():
        Outbox().add(conn, Note(text="s"), destination="notes")
    bodies = [Envelope.from_bytes(bytes(r[0])) for r in db.rows("SELECT body FROM saga.outbox")]
    assert [(e.type, e.payload) for e in bodies] == [
        ("Note", {"text": "a"}),
        ("Note", {"text": "s"}),
    ]
    assert bodies[0].message_id == message_id


def test_add_async_is_undone_with_the_callers_transaction(db: TestDatabase) -> None:
    async def write_then_roll_back() -> None:
        conn = await psycopg.AsyncConnection.connect(db.url)
        async with conn, conn.transaction(force_rollback=True):
            await Outbox().add_async(conn, Note(text="gone"), destination="notes")

    asyncio.run(write_then_roll_back())
    assert outbox_rows(db) == []


def test_add_async_leases_its_rows_to_the_writer_like_add(db: TestDatabase) -> None:
    outbox = Outbox(wake_interval=0.0)
    two = [OutgoingMessage(Envelope.wrap(Note(text=t)), "notes") for t in ("x", "y")]
    leases = Leases()

    async def write(conn: psycopg.AsyncConnection[Any]) -> None:
        with leasing(leases):
            await outbox.add_async(conn, Note(text="one"), destination="notes")
            await outbox.add_many_async(conn, two)

    assert wake_hints(db, lambda: in_async_tx(db, write)) == 0
    assert [row.id for row in leases.written] == [r[0] for r in outbox_rows(db)]
    assert [row.body for row in leases.written][1:] == [m.envelope.to_bytes() for m in two]
    # leased: the relays leave them alone until the lease ends
    assert db.scalar("SELECT count(*) FROM saga.outbox WHERE deliver_after > now()") == 3


def test_add_async_wakes_the_relays_once_per_interval(db: TestDatabase) -> None:
    outbox = Outbox(wake_interval=60.0)

    async def write() -> None:  # one transaction each: PostgreSQL folds repeats within one
        conn = await psycopg.AsyncConnection.connect(db.url, autocommit=True)
        async with conn:
            for i in range(5):
                async with conn.transaction():
                    await outbox.add_async(conn, Note(text=str(i)), destination="notes")

    assert wake_hints(db, lambda: asyncio.run(write())) == 1


# -- start_async, signal_async, cancel_async ---------------------------------------------


@pytest.fixture(autouse=True)
def _effects_table(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)


@contextmanager
def lending_running(db: TestDatabase, broker: TestBroker) -> Iterator[None]:
    with ExitStack() as stack:
        stack.enter_context(running_relay(db, broker))
        stack.enter_context(running_service(registry.as_service(), db, broker))
        stack.enter_context(running_service(loans.bureau, db, broker))
        yield


def start_async(db: TestDatabase, loan_id: str, key: str | None = None) -> UUID:
    data = loans.LoanData(loan_id=loan_id)
    return in_async_tx(
        db, lambda conn: registry.start_async(conn, "loan", data, idempotency_key=key)
    )


def row(db: TestDatabase, saga_id: UUID) -> tuple[Any, ...]:
    return db.rows(
        "SELECT status, step, waiting_for, cancel_requested FROM saga.saga_instances WHERE id = %s",
        (saga_id,),
    )[0]


def waiting_for(db: TestDatabase, saga_id: UUID, event: str) -> tuple[Any, ...]:
    return wait_until(lambda: (r := row(db, saga_id))[2] == event and r, what=f"wait {event}")


def test_start_async_records_the_saga_and_its_start_message_in_one_transaction(
    db: TestDatabase,
) -> None:
    saga_id = start_async(db, "l1", key="l1")
    assert row(db, saga_id) == ("running", None, None, False)
    assert [r[1:] for r in outbox_rows(db)] == [("lending", "saga.StartSaga", saga_id)]
    pending = db.scalar("SELECT pending_message_id FROM saga.saga_instances")
    body = Envelope.from_bytes(bytes(db.scalar("SELECT body FROM saga.outbox")))
    assert body.message_id == pending
    assert start_async(db, "l1", key="l1") == saga_id  # the same key gives the same saga
    with pytest.raises(IdempotencyKeyReused, match=f"'l1' already started saga {saga_id}"):
        start_async(db, "l2", key="l1")  # the same key with other data
    assert db.scalar("SELECT count(*) FROM saga.saga_instances") == 1
    assert len(outbox_rows(db)) == 1


def test_start_async_writes_nothing_when_the_callers_transaction_rolls_back(
    db: TestDatabase,
) -> None:
    async def start_then_fail() -> None:
        conn = await psycopg.AsyncConnection.connect(db.url)
        async with conn:
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await registry.start_async(conn, "loan", loans.LoanData(loan_id="l2"))
                    raise RuntimeError("the business write failed")

    asyncio.run(start_then_fail())
    assert db.scalar("SELECT count(*) FROM saga.saga_instances") == 0
    assert outbox_rows(db) == []


def test_async_started_saga_runs_and_takes_async_signals(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    with lending_running(db, rabbit):
        signals_drive_to_completion(db, start_async(db, "l3"))
    kinds = [r[0] for r in db.rows("SELECT kind FROM effects ORDER BY id")]
    assert kinds == ["request", "disburse"]


def signals_drive_to_completion(db: TestDatabase, saga_id: UUID) -> None:
    assert waiting_for(db, saga_id, "approval")[:2] == ("running", "wait_approval")
    with pytest.raises(SignalRejected, match="waiting for 'approval', not 'signature'"):
        in_async_tx(db, lambda c: registry.signal_async(c, saga_id, "signature", {"signer": "x"}))
    with pytest.raises(SignalRejected, match="invalid 'approval' data"):
        in_async_tx(db, lambda c: registry.signal_async(c, saga_id, "approval", {"nope": 1}))
    in_async_tx(db, lambda c: registry.signal_async(c, saga_id, "approval", {"approver": "ann"}))
    waiting_for(db, saga_id, "signature")
    in_async_tx(db, lambda c: registry.signal_async(c, saga_id, "signature", {"signer": "bo"}))
    wait_until(lambda: row(db, saga_id)[0] == "completed", what="completed")


def test_resume_begins_a_saga_whose_start_message_was_lost(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    lost = start_async(db, "l4")
    # A broker that forgot the start message: the relay had sent it, nothing ran it.
    db.execute("DELETE FROM saga.outbox WHERE saga_id = %s", (lost,))
    with db.connect(autocommit=False) as conn, conn.transaction():
        SagaResumer("saga").resume(conn, lost, stuck_after=timedelta(0), reason="lost")
    with lending_running(db, rabbit):
        assert waiting_for(db, lost, "approval")[:2] == ("running", "wait_approval")


def test_cancel_async_flags_a_running_saga_and_refuses_the_rest(db: TestDatabase) -> None:
    saga_id = start_async(db, "l6")
    in_async_tx(db, lambda c: registry.cancel_async(c, saga_id, "changed my mind"))
    assert row(db, saga_id)[3] is True
    reason = db.scalar("SELECT last_error FROM saga.saga_instances WHERE id = %s", (saga_id,))
    assert reason == "cancelled: changed my mind"
    with pytest.raises(UnknownSaga):
        in_async_tx(db, lambda c: registry.cancel_async(c, UUID(int=7), "who?"))
    db.execute("UPDATE saga.saga_instances SET status = 'completed'")
    with pytest.raises(NotCancellable, match="completed"):
        in_async_tx(db, lambda c: registry.cancel_async(c, saga_id, "too late"))
