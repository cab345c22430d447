"""The orchestrator handles a batch of deliveries with a constant number of statements.

Every saga the batch names is read in one statement, every transition is decided
in memory, and the changed rows, step-log entries and outgoing messages are
written together in one statement. These tests drive the orchestrator's service
through the consumer's :class:`DeliveryBatchProcessor` on a real PostgreSQL and count
the statements the framework sends.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql
from pydantic import BaseModel

from saga import HandlerContext, Saga, SagaRegistry, Service, StepFailed, Tx
from saga.consumers import Delivery, DeliveryBatchProcessor, DeliveryOutcome
from saga.engine.store import SagaStore, records_of_documents
from saga.errors import BatchConflict
from saga.handlers.retry import RetryPolicy
from saga.messaging.control import Signal
from saga.messaging.envelope import Envelope
from saga.messaging.leases import Leases, leasing
from tests.support.databases import TestDatabase
from tests.support.services import EFFECTS_DDL

JSON = "application/json"
NO_RETRY = RetryPolicy(immediate_attempts=1, delays=(60,))


class Order(BaseModel):
    order_id: str
    local: str = "ok"  # "ok", "skip", "refuse" (StepFailed) or "crash" (any other error)


class Reserve(BaseModel):
    order_id: str


class Reserved(BaseModel):
    order_id: str


class Release(BaseModel):
    order_id: str


class Approval(BaseModel):
    by: str


order = Saga("batched_order", data=Order)
order.remote("reserve", service="stock", command=Reserve, reply=Reserved, compensate=Release)


@order.local("record", when=lambda data: data.local != "skip")
def record(tx: Tx, data: Order) -> None:
    tx.execute("INSERT INTO public.effects (kind, key) VALUES ('record', %s)", (data.order_id,))
    if data.local == "refuse":
        raise StepFailed("refused by the record step")
    if data.local == "crash":
        raise RuntimeError("the record step crashed")


order.wait("approve", event="approved", payload=Approval, timeout=timedelta(hours=1))
registry = SagaRegistry("orders", retry=NO_RETRY)
registry.register(order)

stock = Service("stock", retry=NO_RETRY)


@stock.handler(Reserve)
def reserve(tx: Tx, cmd: Reserve, ctx: HandlerContext) -> Reserved:
    return Reserved(order_id=cmd.order_id)


class CountingCursor(psycopg.Cursor[Any]):
    """Counts the statements sent through cursors (``conn.execute`` included)."""

    sent = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        CountingCursor.sent += 1
        return super().execute(*args, **kwargs)


def _start(db: TestDatabase, orders: list[Order]) -> None:
    with db.connect(autocommit=False) as conn, conn.transaction():
        for data in orders:
            order.start(conn, data, idempotency_key=data.order_id)


def _outbox(db: TestDatabase, destination: str) -> list[Delivery]:
    rows = db.rows(
        "DELETE FROM saga.outbox WHERE destination = %s RETURNING id, body", (destination,)
    )
    return [Delivery(bytes(body), JSON) for _, body in sorted(rows)]


def _replies_for(db: TestDatabase, orders: list[Order]) -> list[Delivery]:
    """Start ``orders`` and let the stock service answer: the replies, not yet handled."""
    _start(db, orders)
    with psycopg.connect(db.url) as conn:
        DeliveryBatchProcessor(stock).process(conn, _outbox(db, "stock"))
    return _outbox(db, "orders")


def _statuses(db: TestDatabase) -> dict[str, tuple[str, str | None]]:
    rows = db.rows("SELECT data->>'order_id', status, step FROM saga.saga_instances")
    return {key: (status, step) for key, status, step in rows}


def _handle(db: TestDatabase, deliveries: list[Delivery]) -> tuple[list[DeliveryOutcome], int]:
    """Handle ``deliveries`` as one batch of the orchestrator; outcomes, statements sent."""
    # As the worker does: the rows it wrote are published after the commit, no relay woken.
    with psycopg.connect(db.url, cursor_factory=CountingCursor) as conn, leasing(Leases()):
        CountingCursor.sent = 0
        outcomes = DeliveryBatchProcessor(registry.as_service()).process(conn, deliveries)
        return outcomes, CountingCursor.sent


def test_a_batch_of_replies_costs_fewer_statements_than_deliveries(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)
    replies = _replies_for(db, [Order(order_id=f"o{i}", local="skip") for i in range(12)])

    outcomes, statements = _handle(db, replies)

    assert outcomes == [DeliveryOutcome.HANDLED] * 12
    assert set(_statuses(db).values()) == {("running", "approve")}
    # lock timeout, inbox with the sagas read, the segment's savepoint, and the sagas with
    # their log and their timeout timers in one statement
    assert statements == 4
    assert db.scalar("SELECT count(*) FROM saga.saga_steps WHERE outcome = 'skipped'") == 12
    assert len(_outbox(db, "orders")) == 12  # each wait's timeout, in one insert


def test_local_steps_in_a_batch_share_their_segment_s_savepoint(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)
    replies = _replies_for(db, [Order(order_id=f"o{i}") for i in range(12)])

    outcomes, statements = _handle(db, replies)

    assert outcomes == [DeliveryOutcome.HANDLED] * 12
    assert set(_statuses(db).values()) == {("running", "approve")}
    # the four of a batch, then each saga's local step: its insert alone
    assert statements == 4 + 12
    assert db.scalar("SELECT count(*) FROM public.effects WHERE kind = 'record'") == 12


def test_one_delivery_alone_is_written_directly(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)
    (reply,) = _replies_for(db, [Order(order_id="alone", local="skip")])
    outcomes, statements = _handle(db, [reply])
    assert outcomes == [DeliveryOutcome.HANDLED]
    assert _statuses(db) == {"alone": ("running", "approve")}
    # inbox with the saga's row read, the row with its log and timer: no savepoint
    assert statements == 2


def test_a_failing_local_step_spoils_only_its_own_saga(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)
    replies = _replies_for(
        db,
        [
            Order(order_id="fine"),
            Order(order_id="refused", local="refuse"),
            Order(order_id="crashed", local="crash"),
        ],
    )

    outcomes, _ = _handle(db, replies)

    assert outcomes == [
        DeliveryOutcome.HANDLED,
        DeliveryOutcome.HANDLED,
        DeliveryOutcome.RETRY_SCHEDULED,
    ]
    assert _statuses(db) == {
        "fine": ("running", "approve"),
        "refused": ("compensating", "reserve"),  # its release is on its way
        "crashed": ("running", "reserve"),  # untouched: its reply is retried later
    }
    kept = db.rows("SELECT key FROM public.effects WHERE kind = 'record' ORDER BY key")
    assert kept == [("fine",)]  # the refused step's and the crashed step's writes are undone
    assert [d.body for d in _outbox(db, "stock")] != []  # the refused saga's Release


def test_two_events_for_one_saga_in_a_batch_apply_in_order(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)
    (reply,) = _replies_for(db, [Order(order_id="quick")])
    saga_id = db.scalar("SELECT id FROM saga.saga_instances")
    signal = Envelope.wrap(
        Signal(saga_id=saga_id, event="approved", data={"by": "ops"}), saga_id=saga_id
    )
    # The approval is only valid once the reply has moved the saga to its wait step.
    outcomes, _ = _handle(db, [reply, Delivery(signal.to_bytes(), JSON)])

    assert outcomes == [DeliveryOutcome.HANDLED, DeliveryOutcome.HANDLED]
    assert _statuses(db) == {"quick": ("completed", None)}


def test_a_lock_conflict_sends_the_batch_back_without_writing_anything(
    db: TestDatabase,
) -> None:
    db.execute(EFFECTS_DDL)
    replies = _replies_for(db, [Order(order_id="free"), Order(order_id="held")])
    with db.connect(autocommit=False) as holder:
        holder.execute(
            "SELECT 1 FROM saga.saga_instances WHERE data->>'order_id' = 'held' FOR UPDATE"
        )
        with pytest.raises(BatchConflict):
            _handle(db, replies)
        assert set(_statuses(db).values()) == {("running", "reserve")}  # nothing written
        holder.rollback()

    for reply in replies:  # what the worker then does: one delivery per transaction
        assert _handle(db, [reply])[0] == [DeliveryOutcome.HANDLED]
    assert set(_statuses(db).values()) == {("running", "approve")}


@pytest.mark.parametrize("plan", ["custom", "generic"])
def test_a_batch_writes_its_sagas_found_by_key_however_many_there_are(
    db: TestDatabase, plan: str
) -> None:
    _start(db, [Order(order_id="k1"), Order(order_id="k2")])
    db.execute(
        "INSERT INTO saga.saga_instances (id, name, saga_version, service, status, data) "
        "SELECT gen_random_uuid(), 'other', 1, 'orders', 'completed', '{}' "
        "FROM generate_series(1, 5000)"
    )
    db.execute("ANALYZE saga.saga_instances")
    store = SagaStore("saga")
    with psycopg.connect(db.url) as conn:
        records = list(store.load_many(conn, [_saga_id(db, "k1"), _saga_id(db, "k2")]).values())
        statement, (rows, ids) = store.update_many_statement(records)
        if plan == "custom":
            explained = conn.execute(f"EXPLAIN {statement}", (rows, ids))
        else:  # as a prepared statement's plan may end up: made for any parameters
            conn.execute(
                "PREPARE update_many AS " + statement.replace("%s", "$1", 1).replace("%b", "$2", 1)
            )
            conn.execute("SET plan_cache_mode = force_generic_plan")
            call = sql.SQL("EXPLAIN EXECUTE update_many({}, {})")
            explained = conn.execute(call.format(sql.Literal(rows), sql.Literal(ids)))
        shown = "\n".join(row[0] for row in explained)
    assert "Seq Scan on saga_instances" not in shown, shown
    assert "saga_instances_pkey" in shown, shown


def _saga_id(db: TestDatabase, order_id: str) -> UUID:
    query = "SELECT id FROM saga.saga_instances WHERE data->>'order_id' = %s"
    return UUID(str(db.scalar(query, (order_id,))))


def test_a_saga_row_read_as_a_document_is_the_record_a_plain_read_gives(
    db: TestDatabase,
) -> None:
    """The rows a delivery's opening statement reads come back as jsonb documents: every
    field must come back as the plain read gives it (ids, instants, arrays, JSON, NULLs),
    for a running saga and a finished one, whatever the session's time zone."""
    _start(db, [Order(order_id="d1"), Order(order_id="d2")])
    db.execute(
        "UPDATE saga.saga_instances SET status = 'compensated', finished_at = now(), "
        "step_state = '{\"k\": [1, 2]}', last_error = 'no', pending_message_id = NULL, "
        "completed_steps = ARRAY['a', 'b'] WHERE data->>'order_id' = 'd2'"
    )
    store = SagaStore("saga")
    ids = [_saga_id(db, "d1"), _saga_id(db, "d2")]
    with psycopg.connect(db.url) as conn:
        conn.execute("SET TIME ZONE 'America/St_Johns'")  # an offset of -03:30
        query, params = store.documents_read(ids)
        documents = [row[0] for row in conn.execute(query, params)]
        assert records_of_documents(documents) == store.load_many(conn, ids)
    assert len(documents) == 2
