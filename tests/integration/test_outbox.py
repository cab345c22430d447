"""The outbox writer on real PostgreSQL: the caller's transaction decides."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql as psql
from pydantic import BaseModel

from bench.statement_log import log_window, parse
from saga import MessageTooLarge, Outbox
from saga.errors import InvalidIdentifier
from saga.messaging.envelope import Envelope
from saga.messaging.outbox import OutgoingMessage
from tests.support.databases import TestDatabase, wake_hints, with_database


class OrderPlaced(BaseModel):
    order_id: str
    note: str = ""


def test_row_is_written_only_when_the_callers_transaction_commits(db: TestDatabase) -> None:
    outbox = Outbox()
    with db.connect(autocommit=False) as conn:
        with conn.transaction():
            conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
        with conn.transaction(force_rollback=True):
            conn.execute("INSERT INTO orders VALUES ('o1')")
            outbox.add(conn, OrderPlaced(order_id="o1"), destination="billing")
        assert db.scalar("SELECT count(*) FROM saga.outbox") == 0
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES ('o2')")
            message_id = outbox.add(conn, OrderPlaced(order_id="o2"), destination="billing")
    row = db.rows("SELECT message_id, destination, message_type, body FROM saga.outbox")[0]
    assert row[0] == message_id
    assert row[1:3] == ("billing", "OrderPlaced")
    envelope = Envelope.from_bytes(bytes(row[3]))
    assert envelope.message_id == message_id
    assert envelope.payload == {"order_id": "o2", "note": ""}
    assert message_id.version == 7


def test_add_never_commits_by_itself(db: TestDatabase) -> None:
    with db.connect(autocommit=False) as conn:
        Outbox().add(conn, OrderPlaced(order_id="o1"), destination="billing")
        conn.rollback()
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0


def test_too_large_message_raises_and_leaves_the_transaction_usable(db: TestDatabase) -> None:
    outbox = Outbox(max_message_bytes=1024)
    with db.connect(autocommit=False) as conn, conn.transaction():
        outbox.add(conn, OrderPlaced(order_id="small"), destination="billing")
        with pytest.raises(MessageTooLarge, match="over the 1024-byte cap"):
            outbox.add(conn, OrderPlaced(order_id="big", note="x" * 2000), destination="billing")
        outbox.add(conn, OrderPlaced(order_id="after"), destination="billing")
    types = db.rows("SELECT body FROM saga.outbox ORDER BY id")
    assert [Envelope.from_bytes(bytes(r[0])).payload["order_id"] for r in types] == [
        "small",
        "after",
    ]


def test_default_cap_is_256_kib(db: TestDatabase) -> None:
    with db.connect(autocommit=False) as conn, pytest.raises(MessageTooLarge):
        Outbox().add(conn, OrderPlaced(order_id="big", note="x" * 262_144), destination="billing")


def test_deliver_after_holds_the_row_in_the_scheduled_index(db: TestDatabase) -> None:
    with db.connect(autocommit=False) as conn, conn.transaction():
        Outbox().add(
            conn,
            OrderPlaced(order_id="later"),
            destination="billing",
            deliver_after=timedelta(minutes=5),
        )
    delay = db.scalar("SELECT deliver_after - created_at FROM saga.outbox")
    assert delay == timedelta(minutes=5)


def test_async_connection(db: TestDatabase) -> None:
    async def write() -> None:
        conn = await psycopg.AsyncConnection.connect(db.url)
        async with conn, conn.transaction():
            await Outbox().add_async(conn, OrderPlaced(order_id="a1"), destination="billing")

    asyncio.run(write())
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 1


def test_bad_destination_is_refused(db: TestDatabase) -> None:
    with db.connect(autocommit=False) as conn, pytest.raises(InvalidIdentifier):
        Outbox().add(conn, OrderPlaced(order_id="x"), destination="no spaces please")


def test_wake_hint_is_debounced(db: TestDatabase) -> None:
    """Writes in separate transactions: PostgreSQL folds repeats within one on its own."""
    outbox = Outbox(wake_interval=60.0)

    def write() -> None:
        with db.connect() as conn:
            for i in range(10):
                with conn.transaction():
                    outbox.add(conn, OrderPlaced(order_id=str(i)), destination="billing")

    assert wake_hints(db, write) == 1
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 10


@pytest.mark.parametrize("rows", [1, 3])
def test_a_write_wakes_the_relays_in_its_insert_with_no_statement_of_its_own(
    db: TestDatabase, rows: int
) -> None:
    """An application's write is its insert alone between BEGIN and COMMIT, and the relays
    are woken all the same (the NOTIFY rides on the insert)."""
    outbox = Outbox(wake_interval=0.0)
    db.execute(
        psql.SQL("ALTER DATABASE {} SET log_statement = 'all'")  # type: ignore[arg-type]
        .format(psql.Identifier(db.name))
        .as_string()
    )
    messages = [
        OutgoingMessage(outbox.envelope(OrderPlaced(order_id=str(i))), "billing")
        for i in range(rows)
    ]

    def write() -> None:
        with db.connect() as conn, conn.transaction():
            outbox.add_many(conn, messages)

    with log_window(with_database(db.url, "postgres"), [db.name]) as lines:
        assert wake_hints(db, write) == 1
    (written,) = [
        t.statements for t in parse(lines) if any("INSERT INTO" in s.sql for s in t.statements)
    ]
    assert [s.sql.split(None, 1)[0] for s in written] == ["BEGIN", "INSERT", "COMMIT"], written
