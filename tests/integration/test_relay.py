"""The relay on real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql as psql
from pydantic import BaseModel

from bench.statement_log import log_window, parse
from saga import Outbox
from saga.broker.reconnect import transient_errors
from saga.db.sql import render
from saga.errors import UnsafeDurability
from saga.messaging.envelope import Envelope
from saga.messaging.outbox import wake_channel
from saga.outbox_relay import Relay, RelayOptions
from saga.outbox_relay.claims import _READY, RelayStore
from saga.outbox_relay.sweep_floor import SweepFloor
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase, with_database
from tests.support.running import in_thread
from tests.support.tcp_proxy import TcpProxy
from tests.support.wait import wait_until


class Note(BaseModel):
    text: str


def _write(db: TestDatabase, *texts: str, destination: str = "notes") -> None:
    with db.connect(autocommit=False) as conn, conn.transaction():
        for text in texts:
            Outbox().add(conn, Note(text=text), destination=destination)


def _relay(db: TestDatabase, broker: TestBroker, **options: object) -> Relay:
    return Relay(db.url, broker.config, RelayOptions(**options), broker.topology)  # type: ignore[arg-type]


def _texts(messages: list) -> list[str]:  # type: ignore[type-arg]
    return [json.loads(m.body)["payload"]["text"] for m in messages]


def test_relay_publishes_committed_rows_durably_and_deletes_them(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    _write(db, "a", "b", "c")
    with _relay(db, rabbit) as relay:
        assert relay.drain() == 3
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0
    messages = rabbit.receive("notes", 3)
    assert _texts(messages) == ["a", "b", "c"]
    first = messages[0]
    assert first.content_type == "application/json"
    assert first.properties["delivery_mode"] == 2
    assert first.properties["message_id"] == str(Envelope.from_bytes(first.body).message_id)


def test_late_commit_is_not_skipped(db: TestDatabase, rabbit: TestBroker) -> None:
    """A row committed after a higher id was relayed is still relayed."""
    with db.connect(autocommit=False) as slow, _relay(db, rabbit) as relay:
        with slow.transaction():
            Outbox().add(slow, Note(text="A (lower id, commits late)"), destination="notes")
            _write(db, "B (higher id, commits first)")
            assert relay.drain() == 1
            assert _texts(rabbit.receive("notes", 1)) == ["B (higher id, commits first)"]
        assert relay.drain() == 1
    assert _texts(rabbit.receive("notes", 1)) == ["A (lower id, commits late)"]
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0


def test_delayed_message_is_not_sent_before_its_time(db: TestDatabase, rabbit: TestBroker) -> None:
    with db.connect(autocommit=False) as conn, conn.transaction():
        Outbox().add(
            conn, Note(text="soon"), destination="notes", deliver_after=timedelta(seconds=2)
        )
        Outbox().add(
            conn, Note(text="later"), destination="notes", deliver_after=timedelta(hours=1)
        )
    due = db.scalar("SELECT min(deliver_after) FROM saga.outbox")
    drains: list[tuple[int, Any]] = []  # (published, the database's clock right after)

    def drained_the_due_one() -> bool:
        drains.append((relay.drain(), db.scalar("SELECT clock_timestamp()")))
        return drains[-1][0] == 1

    with _relay(db, rabbit) as relay:
        wait_until(drained_the_due_one, timeout=30, what="the delayed message")
        assert relay.drain() == 0
    # Only a drain that ended after the message fell due published it (by the database's
    # clock, the one deliver_after is kept in), however long this machine took to get here.
    assert [n for n, _ in drains] == [0] * (len(drains) - 1) + [1]
    assert drains[-1][1] >= due
    assert _texts(rabbit.receive("notes", 1)) == ["soon"]
    assert db.scalar("SELECT count(*) FROM saga.outbox WHERE deliver_after IS NOT NULL") == 1


def test_unroutable_rows_are_retried_then_quarantined_without_blocking(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    rabbit.declare("notes")  # only "notes" has a queue; "nowhere" has none
    _write(db, "lost?", destination="nowhere")
    _write(db, "fine", destination="notes")
    with _relay(
        db, rabbit, declare_queues=False, max_publish_attempts=2, retry_base_delay=0.0
    ) as relay:
        first = relay.relay_batch()
        assert (first.published, first.deferred) == (1, 1)
        relay.promote_due()
        second = relay.relay_batch()
        assert second.quarantined == 1
    assert _texts(rabbit.receive("notes", 1)) == ["fine"]
    letters = db.rows(
        "SELECT consumer, reason, error_type, destination, attempts, error_message "
        "FROM saga.dead_letters"
    )
    assert len(letters) == 1
    assert letters[0][:5] == ("outbox_relay", "unpublishable", "Unroutable", "nowhere", 2)
    assert "no queue" in letters[0][5]
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0


def test_a_message_the_broker_nacked_keeps_its_row_and_is_published_again(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """A queue that holds one message and refuses more (``reject-publish``) makes RabbitMQ
    nack the rest of the batch: their rows stay and go out once the queue has room."""
    rabbit.topology = replace(
        rabbit.topology, queue_arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    )
    rabbit.declare("notes")
    _write(db, "a", "b", "c")
    received: list[str] = []
    with _relay(db, rabbit, retry_base_delay=0.0) as relay:
        first = relay.relay_batch()
        assert (first.published, first.deferred) == (1, 2)
        errors = db.rows("SELECT last_error FROM saga.outbox")
        assert [e[0].split(":")[0] for e in errors] == ["Nacked", "Nacked"]
        while db.scalar("SELECT count(*) FROM saga.outbox"):
            received += _texts(rabbit.receive("notes", 1))  # room for one more
            relay.promote_due()
            relay.relay_batch()
    received += _texts(rabbit.receive("notes", 1))
    assert received == ["a", "b", "c"]
    assert rabbit.queue_depth("notes") == 0


def test_a_batch_whose_confirms_never_arrived_keeps_its_rows_and_is_published_again(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """The connection is lost after RabbitMQ took the batch and before its confirms reached
    the relay: the rows stay, and the relay publishes them again once reconnected."""
    rabbit.declare("notes")
    with TcpProxy(rabbit.url) as proxy:
        broker = replace(rabbit.config, url=proxy.url)
        with Relay(db.url, broker, RelayOptions(), rabbit.topology) as relay:
            _write(db, "warm-up")
            assert relay.drain() == 1  # the channel is open and in confirm mode
            proxy.hold_replies()
            _write(db, "unconfirmed")
            with ThreadPoolExecutor(1) as pool:
                batch = pool.submit(relay.relay_batch)
                wait_until(lambda: rabbit.queue_depth("notes") == 2, what="RabbitMQ to take it")
                proxy.cut()
                lost = batch.exception(timeout=60)
            assert isinstance(lost, transient_errors(broker.connect())), lost
            assert db.scalar("SELECT count(*) FROM saga.outbox") == 1
            proxy.release()
            relay.connect()
            assert relay.drain() == 1
    assert _texts(rabbit.receive("notes", 3)) == ["warm-up", "unconfirmed", "unconfirmed"]


def test_relay_refuses_a_session_with_synchronous_commit_off(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    db.execute(f'ALTER DATABASE "{db.name}" SET synchronous_commit = off')
    with pytest.raises(UnsafeDurability, match="synchronous_commit is off"):
        _relay(db, rabbit).connect()
    relay = _relay(db, rabbit, allow_async_commit=True)
    relay.connect()
    relay.close()


def test_two_relays_share_the_work_without_duplicates(db: TestDatabase, rabbit: TestBroker) -> None:
    _write(db, *[f"m{i}" for i in range(2000)])
    relays = [_relay(db, rabbit, batch_size=50) for _ in range(2)]
    with in_thread(relays[0].run, "relay-1"), in_thread(relays[1].run, "relay-2"):
        wait_until(lambda: db.scalar("SELECT count(*) FROM saga.outbox") == 0, what="drained")
    texts = _texts(rabbit.receive("notes", 2000, timeout=30))
    assert sorted(texts) == sorted(f"m{i}" for i in range(2000))
    assert rabbit.queue_depth("notes") == 0  # no late duplicate behind the 2000
    assert all(r.published_total > 0 for r in relays)
    assert sum(r.published_total for r in relays) == 2000


def test_relay_reconnects_after_losing_its_database_connections(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    from tests.support.running import running_relay

    _write(db, "before")
    with running_relay(db, rabbit):
        wait_until(lambda: db.scalar("SELECT count(*) FROM saga.outbox") == 0, what="first row")
        killed = db.scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert killed >= 2  # the relay's claim and LISTEN connections
        _write(db, "after")
        wait_until(
            lambda: db.scalar("SELECT count(*) FROM saga.outbox") == 0, what="after reconnect"
        )
    assert sorted(_texts(rabbit.receive("notes", 2))) == ["after", "before"]


def test_only_the_relays_lease_and_delete_commit_without_waiting_for_the_disk(
    db: TestDatabase,
) -> None:
    store = RelayStore("saga")
    _write(db, "a", "b")
    with db.connect(autocommit=False) as conn:
        with conn.transaction():  # a writer's transaction keeps the server's setting
            Outbox().add(conn, Note(text="c"), destination="notes")
            assert _synchronous_commit(conn) == "on"
        rows = store.lease(conn, 10, timedelta(seconds=5))  # the relay's lease
        assert _synchronous_commit(conn) == "off"
        conn.commit()
        assert _synchronous_commit(conn) == "on"  # for that transaction only
        store.settle(conn, [rows[0].id], [])  # the relay's delete of what the broker took
        assert _synchronous_commit(conn) == "off"
        conn.commit()
        assert _synchronous_commit(conn) == "on"
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 2


def _synchronous_commit(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT current_setting('synchronous_commit')").fetchone()
    assert row is not None
    return str(row[0])


def test_a_sweep_reads_a_few_pages_with_20000_rows_published_behind_a_held_snapshot(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """A snapshot held on the database (a report, a forgotten psql window) keeps the index
    entries of every row published since from being reclaimed: the relay's sweep starts
    past them, at its floor, and reads a few pages, not 20,000 rows' worth."""
    rabbit.use("notes")
    insert = (
        "INSERT INTO saga.outbox (message_id, destination, message_type, body) "
        "SELECT gen_random_uuid(), 'notes', 'Note', convert_to(repeat('x', 300), 'UTF8') "
        "FROM generate_series(1, %s)"
    )
    with (
        db.connect(autocommit=False) as holder,
        db.connect() as conn,
        _relay(db, rabbit, batch_size=500) as relay,
    ):
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        relay.sweep_floor = SweepFloor(lag=0)  # no writer here commits late
        conn.execute(insert, (20_000,))
        while relay.relay_batch().claimed:
            pass
        relay.relay_batch()  # finds nothing: the floor moves to the next id
        conn.execute(insert, (10,))
        ready = render(_READY, "saga")  # what a lease takes
        explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + ready  # locks, changes nothing
        row = conn.execute(explain, (relay.sweep_floor.floor(), 100)).fetchone()
        holder.rollback()
    assert row is not None
    plan = row[0][0]["Plan"]
    pages = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    assert plan["Actual Rows"] == 10
    assert pages < 100, f"a sweep read {pages} pages, 20,000 rows published behind it"


def test_a_poll_that_finds_nothing_is_one_statement_outside_any_transaction(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """Below full load most of a relay's polls find nothing: each must cost the server one
    statement, not a transaction (BEGIN, claim, COMMIT), and so must a promotion of due
    rows; a row that comes is still taken."""
    db.execute(
        psql.SQL("ALTER DATABASE {} SET log_statement = 'all'")  # type: ignore[arg-type]
        .format(psql.Identifier(db.name))
        .as_string()
    )
    with _relay(db, rabbit) as relay:
        with log_window(with_database(db.url, "postgres"), [db.name]) as lines:
            for _ in range(10):
                assert relay.relay_batch().claimed == 0
            assert relay.promote_due() == 0
        _write(db, "after the polls")
        assert relay.relay_batch().published == 1
    polls = [t for t in parse(lines) if t.work]
    assert len(polls) == 11, polls
    assert all(len(t.statements) == 1 for t in polls), [t.statements for t in polls]
    assert _texts(rabbit.receive("notes", 1)) == ["after the polls"]


def test_a_relay_woken_by_a_notify_claims_without_probing_once_a_sweep_was_noted(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """A NOTIFY says a writer committed rows: the batch goes straight to its claim, with no
    probe before it, unless no sweep was noted lately (a relay's first batch probes)."""
    db.execute(
        psql.SQL("ALTER DATABASE {} SET log_statement = 'all'")  # type: ignore[arg-type]
        .format(psql.Identifier(db.name))
        .as_string()
    )

    def probes(lines: list[str]) -> int:
        return sum("pg_sequence_last_value" in s.sql for t in parse(lines) for s in t.statements)

    with _relay(db, rabbit) as relay:
        _write(db, "first")
        with log_window(with_database(db.url, "postgres"), [db.name]) as first:
            assert relay.relay_batch(woken=True).published == 1  # nothing noted yet
        _write(db, "second")
        with log_window(with_database(db.url, "postgres"), [db.name]) as second:
            assert relay.relay_batch(woken=True).published == 1
    assert (probes(first), probes(second)) == (1, 0)
    assert _texts(rabbit.receive("notes", 2)) == ["first", "second"]


def test_a_waiting_relay_sleeps_until_its_time_or_a_notify(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """Between polls the relay sleeps on its LISTEN socket: next to no CPU (it does not spin
    through the last fraction of a millisecond of each wait), and a NOTIFY ends the wait."""
    stop = threading.Event()
    with _relay(db, rabbit) as relay:
        cpu, started = time.thread_time(), time.monotonic()
        for _ in range(40):
            relay._wait(stop, 0.0049)
        cpu, waited = time.thread_time() - cpu, time.monotonic() - started
        assert cpu < 0.1 * waited, f"{cpu * 1000:.1f} ms of CPU in {waited * 1000:.0f} ms of waits"
        db.execute(f"NOTIFY {wake_channel('saga')}")
        waiting = threading.Thread(target=relay._wait, args=(stop, 3600.0))
        waiting.start()
        waiting.join(60)
        woken = not waiting.is_alive()
        stop.set()  # ends the wait if the NOTIFY did not
        waiting.join(60)
    assert woken, "the NOTIFY did not end the wait"


def test_a_woken_relay_batch_is_a_lease_and_a_delete_each_a_statement_of_its_own(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """A batch costs the server two statements outside any transaction: the lease of its
    rows before the publish, their delete after it (no BEGIN, no COMMIT, no claim held
    open across the publish)."""
    db.execute(
        psql.SQL("ALTER DATABASE {} SET log_statement = 'all'")  # type: ignore[arg-type]
        .format(psql.Identifier(db.name))
        .as_string()
    )
    rabbit.declare("notes")
    with _relay(db, rabbit) as relay:
        _write(db, "first")
        assert relay.relay_batch(woken=True).published == 1  # notes a sweep
        _write(db, "second", "third")
        with log_window(with_database(db.url, "postgres"), [db.name]) as lines:
            assert relay.relay_batch(woken=True).published == 2
    batch = [t.statements for t in parse(lines) if t.work]
    assert [len(statements) for statements in batch] == [1, 1], batch
    (lease,), (delete,) = batch
    assert lease.sql.startswith("UPDATE") and delete.sql.startswith("WITH gone AS (DELETE")
    assert _texts(rabbit.receive("notes", 3)) == ["first", "second", "third"]


def test_rows_leased_to_a_relay_are_left_alone_until_the_lease_lapses(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """A relay that leased rows and died (nothing published, nothing deleted): no other
    relay takes them while the lease runs; once it has lapsed they go out."""
    rabbit.declare("notes")
    _write(db, "a", "b")
    with db.connect() as conn:
        leased = RelayStore("saga").lease(conn, 10, timedelta(seconds=1))
    assert [row.id for row in leased] == sorted(row.id for row in leased) and len(leased) == 2
    with _relay(db, rabbit) as relay:
        assert relay.drain() == 0  # leased: not ready, not due
        assert db.scalar("SELECT count(*) FROM saga.outbox") == 2
        wait_until(lambda: relay.promote_due() == 2, what="the lease to lapse")
        assert relay.drain() == 2
    assert sorted(_texts(rabbit.receive("notes", 2))) == ["a", "b"]
    assert rabbit.queue_depth("notes") == 0
