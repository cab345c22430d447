"""PostgreSQL as the broker: leases bring back what a dead consumer held, acks are fenced."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from kombu import Consumer, Message
from prometheus_client import CollectorRegistry
from psycopg import sql

from saga.broker.postgres.messages import claim_parameters, claim_statement
from saga.broker.transport import BrokerConfig
from saga.examples.order_saga.processes import SagaProcess, saga_env
from saga.messaging.envelope import Envelope
from saga.observability.metrics import Metrics
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.services import EFFECTS_DDL, Ping, service
from tests.support.wait import wait_until

JSON = "application/json"
LEASE = 2.0


def _rows(broker: TestBroker, destination: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(broker.url) as conn:
        return conn.execute(
            "SELECT id, lock_token, attempts, visible_at > now() FROM saga_broker.messages "
            "WHERE queue = %s ORDER BY id",
            (broker.topology.queue_name(destination),),
        ).fetchall()


def _lease_left(broker: TestBroker, destination: str) -> list[float]:
    """Seconds until each message of the queue is visible again, by the database's clock."""
    with psycopg.connect(broker.url) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM visible_at - now()) FROM saga_broker.messages "
            "WHERE queue = %s ORDER BY id",
            (broker.topology.queue_name(destination),),
        ).fetchall()
    return [float(row[0]) for row in rows]


def _effects(db: TestDatabase, key: str) -> int:
    return int(db.scalar("SELECT count(*) FROM effects WHERE key = %s", (key,)))


def test_a_consumer_killed_after_its_commit_loses_nothing_and_applies_nothing_twice(
    db: TestDatabase, pg_broker: TestBroker, tmp_path: Path
) -> None:
    """The consumer handles the message, commits, and is SIGKILLed before its ack: the
    message comes back when the lease ends, another consumer takes it, the inbox skips it."""
    db.execute(EFFECTS_DDL)
    env = saga_env(
        db.url, pg_broker.url, pg_broker.topology.queue_prefix, SAGA_BROKER_LEASE=str(LEASE)
    )
    pg_broker.publish_raw(service.name, Envelope.wrap(Ping(key="crash")).to_bytes(), JSON)
    args = ["consume", "tests.support.services:service"]
    doomed = SagaProcess(args, {**env, "SAGA_FAULTS": "consumer.after_commit"}, tmp_path, "c1")
    assert doomed.wait(60) == -9, doomed.output()
    assert _effects(db, "crash") == 1
    ((_, token, attempts, _),) = _rows(pg_broker, service.name)
    assert token is not None and attempts == 1  # taken by the dead consumer, never acked
    (left,) = _lease_left(pg_broker, service.name)
    assert left <= LEASE  # back when the dead consumer's lease ends (not a default's)
    survivor = SagaProcess(args, env, tmp_path, "c2")
    try:
        wait_until(lambda: not _rows(pg_broker, service.name), 60, what="the redelivery acked")
    finally:
        assert survivor.terminate() == 0, survivor.output()
    assert _effects(db, "crash") == 1


_HOLDER = """
import sys, time
from kombu import Consumer
from saga.broker.transport import BrokerConfig, Topology
config = BrokerConfig(sys.argv[1], lease=float(sys.argv[3]))
queue = Topology(queue_prefix=sys.argv[2]).queue("svc")
held = []
with config.connect() as conn:
    channel = conn.channel()
    Consumer(channel, queues=[queue], on_message=held.append, accept=["application/json"]).consume()
    while not held:
        try:
            conn.drain_events(timeout=1)
        except TimeoutError:
            pass
    print("holding", len(held), flush=True)
    while True:
        time.sleep(60)  # never acks: waits for its SIGKILL
"""


def test_messages_taken_without_ack_by_a_killed_consumer_come_back_within_the_lease(
    pg_broker: TestBroker,
) -> None:
    pg_broker.publish_many("svc", [b'{"n": 1}', b'{"n": 2}'])
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, pg_broker.url, pg_broker.topology.queue_prefix, str(LEASE)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().startswith("holding 2")
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    dead = _rows(pg_broker, "svc")
    assert [r[2] for r in dead] == [1, 1] and all(r[1] is not None for r in dead)
    assert all(left <= LEASE for left in _lease_left(pg_broker, "svc"))  # the holder's lease
    received: list[Any] = []

    def on_message(body: Any, message: Message) -> None:
        received.append(body)
        message.ack()

    with pg_broker.config.connect() as conn:
        queue = pg_broker.topology.queue("svc")
        Consumer(conn.channel(), queues=[queue], callbacks=[on_message], accept=[JSON]).consume()

        def delivered() -> bool:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.2)
            return len(received) == 2

        wait_until(delivered, 60, what="both messages back after the lease")
        # The dead consumer's token fences it off: it cannot delete what the survivor holds.
        with psycopg.connect(pg_broker.url, autocommit=True) as db:
            stale = db.execute(
                "DELETE FROM saga_broker.messages WHERE id = ANY(%s) AND lock_token = ANY(%s)",
                ([r[0] for r in dead], [r[1] for r in dead]),
            )
            assert stale.rowcount == 0
    assert received == [{"n": 1}, {"n": 2}]
    assert _rows(pg_broker, "svc") == []  # acked: deleted when the channel closed


def test_a_consumer_that_holds_a_batch_past_its_lease_keeps_it_by_renewing(
    pg_broker: TestBroker,
) -> None:
    pg_broker.publish_many("svc", [b'{"n": 1}'])
    queue = pg_broker.topology.queue("svc")
    config = replace(pg_broker.config, lease=LEASE)  # renewed every third of it
    held: list[Message] = []
    with config.connect() as holder, config.connect() as other:
        Consumer(holder.channel(), queues=[queue], on_message=held.append, accept=[JSON]).consume()
        wait_until(lambda: _drain(holder) or held, what="the message taken")
        ((_, token, _, _),) = _rows(pg_broker, "svc")
        first_deadline = _visible_at(pg_broker)
        wait_until(  # a renewal made after the first lease had run out
            lambda: _visible_at(pg_broker) > first_deadline + timedelta(seconds=LEASE),
            what="the lease renewed past its first end",
        )
        thief: list[Message] = []
        Consumer(other.channel(), queues=[queue], on_message=thief.append, accept=[JSON]).consume()
        _drain(other)
        assert thief == [] and _rows(pg_broker, "svc")[0][1] == token
        held[0].ack()
    assert _rows(pg_broker, "svc") == []


def test_a_channel_that_neither_rotates_nor_vacuums_still_renews_its_leases(
    pg_broker: TestBroker,
) -> None:
    pg_broker.publish_many("svc", [b'{"n": 1}'])
    config = replace(pg_broker.config, lease=LEASE)
    with config.connect() as conn:
        conn.transport_options.update(rotate_interval=0, vacuum_interval=0)
        channel = conn.channel()
        assert len(channel.claim([pg_broker.topology.queue_name("svc")], 10)) == 1
        first_deadline = _visible_at(pg_broker)
        wait_until(
            lambda: _visible_at(pg_broker) > first_deadline,
            what="the lease renewed by a channel with no other work on its thread",
        )


def test_a_consuming_channel_vacuums_the_messages_table(pg_broker: TestBroker) -> None:
    """Every message leaves dead tuples behind (its claim, its delete): the consuming side
    vacuums the table on its own, at a pace autovacuum's defaults never reach."""
    pg_broker.publish_many("svc", [b'{"n": %d}' % i for i in range(50)])
    queue = pg_broker.topology.queue("svc")
    before = _vacuums(pg_broker)
    taken: list[Message] = []

    def take(message: Message) -> None:
        taken.append(message)
        message.ack()

    with pg_broker.config.connect() as conn:
        conn.transport_options["vacuum_interval"] = 0.2
        Consumer(conn.channel(), queues=[queue], on_message=take, accept=[JSON]).consume()
        wait_until(
            lambda: _drain(conn) or (len(taken) == 50 and _vacuums(pg_broker) > before),
            what="the messages taken and the table vacuumed",
        )
    assert _rows(pg_broker, "svc") == []


def test_a_claim_reads_the_same_few_pages_however_deep_the_backlog(
    pg_broker: TestBroker,
) -> None:
    """A claim walks its queue's index in order and stops at the limit: with 20,000
    messages waiting it reads a few pages, where sorting the backlog reads all of them.
    The table is not analyzed since they came (a backlog growing faster than autovacuum
    looks): the claim must not depend on the planner's estimates."""
    pg_broker.declare("svc")
    queue = pg_broker.topology.queue_name("svc")
    with psycopg.connect(pg_broker.url) as conn:
        conn.execute(
            "INSERT INTO saga_broker.messages (queue, body) "
            "SELECT %s, convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, 20000)",
            (queue,),
        )
        conn.commit()
        conn.execute("SET enable_bitmapscan = off")  # as on the broker's own connections
        explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + claim_statement(
            "saga_broker"
        )
        params = claim_parameters([queue], [None], 10, 30.0, uuid.uuid4())
        row = conn.execute(explain, params).fetchone()
        conn.rollback()  # the claim ran: leave the messages as they were
    assert row is not None
    plan = row[0][0]["Plan"]
    pages = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    assert pages < 500, f"a claim of 10 read {pages} pages of a 20,000-message backlog"


def _vacuums(broker: TestBroker) -> int:
    with psycopg.connect(broker.url) as conn:
        row = conn.execute(  # the partitions of the generations: the table is their union
            "SELECT coalesce(sum(vacuum_count), 0) FROM pg_stat_user_tables "
            "WHERE schemaname = 'saga_broker' AND relname LIKE 'messages\\_%'"
        ).fetchone()
        return int(row[0]) if row else 0


def _drain(conn: Any) -> bool:
    with contextlib.suppress(TimeoutError):
        conn.drain_events(timeout=0.05)
    return False


def _visible_at(broker: TestBroker) -> Any:
    with psycopg.connect(broker.url) as conn:
        row = conn.execute(
            "SELECT max(visible_at) FROM saga_broker.messages WHERE queue = %s",
            (broker.topology.queue_name("svc"),),
        ).fetchone()
        assert row is not None
        return row[0]


def _three_states(broker: TestBroker) -> str:
    """Three messages on the queue of ``svc``, enqueued 90 s ago: one ready, one taken
    (under a lease), one delayed. The queue's name."""
    bodies = [Envelope.wrap(Ping(key=f"s{i}")).to_bytes() for i in range(3)]
    broker.publish_many("svc", bodies, JSON)
    queue = broker.topology.queue_name("svc")
    ids = [row[0] for row in _rows(broker, "svc")]
    with psycopg.connect(broker.url, autocommit=True) as conn:
        conn.execute(
            "UPDATE saga_broker.messages SET enqueued_at = now() - interval '90 seconds' "
            "WHERE id = ANY(%s)",
            (ids,),
        )
        conn.execute(
            "UPDATE saga_broker.messages SET visible_at = now() + interval '1 hour', "
            "lock_token = CASE WHEN id = %s THEN gen_random_uuid() END WHERE id = ANY(%s)",
            (ids[1], ids[1:]),
        )
    return queue


def test_saga_stats_shows_the_depth_and_oldest_age_of_each_postgresql_broker_queue(
    db: TestDatabase, pg_broker: TestBroker
) -> None:
    queue = _three_states(pg_broker)
    result = saga_cli(db.url, "stats", "--json", SAGA_BROKER_URL=pg_broker.url)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["broker_queues"][queue]
    assert {k: figures[k] for k in ("depth", "ready", "in_flight", "delayed")} == {
        "depth": 3, "ready": 1, "in_flight": 1, "delayed": 1,
    }  # fmt: skip
    assert 90 <= figures["oldest_age_s"] < 600
    table = saga_cli(db.url, "stats", "--broker-url", pg_broker.url)
    assert "broker queues" in table.stdout and queue in table.stdout, table.stdout
    without = json.loads(saga_cli(db.url, "stats", "--json").stdout)
    assert "broker_queues" not in without


def test_metrics_report_the_postgresql_broker_queues(pg_broker: TestBroker) -> None:
    queue = _three_states(pg_broker)
    registry = CollectorRegistry()
    Metrics(registry).watch_broker(pg_broker.config.queue_depths)
    value = registry.get_sample_value
    assert value("saga_metrics_broker_up") == 1
    for state in ("ready", "in_flight", "delayed"):
        assert value("saga_broker_queue_messages", {"queue": queue, "state": state}) == 1
    age = value("saga_broker_queue_oldest_age_seconds", {"queue": queue})
    assert age is not None and 90 <= age < 600


def test_metrics_say_when_the_broker_cannot_be_read() -> None:
    unreachable = BrokerConfig("postgresql://postgres:secret@127.0.0.1:1/broker")
    registry = CollectorRegistry()
    Metrics(registry).watch_broker(unreachable.queue_depths)
    assert registry.get_sample_value("saga_metrics_broker_up") == 0
    assert registry.get_sample_value("saga_broker_queue_messages") is None


def test_a_claim_reads_a_few_pages_with_20000_messages_consumed_behind_a_held_snapshot(
    pg_broker: TestBroker,
) -> None:
    """A transaction that holds a snapshot (a report, a ``pg_dump``, a forgotten psql
    window) keeps every row consumed since it began from being reclaimed. The claim must
    not read that history: with 20,000 messages taken and deleted behind it, a claim of
    the next 10 reads a few pages, not the dead index entries of all 20,000."""
    pg_broker.declare("svc")
    queue = pg_broker.topology.queue_name("svc")
    with psycopg.connect(pg_broker.url) as holder, pg_broker.config.connect() as conn:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        channel = conn.channel()
        _insert(pg_broker, queue, 20_000, enqueued_ago=60)
        consumed = 0
        while taken := channel.claim([queue], 500):
            channel.settle([p["properties"]["delivery_tag"] for p, _ in taken], delete=True)
            consumed += len(taken)
        channel.flush_acks()
        assert consumed == 20_000
        _insert(pg_broker, queue, 10)
        with psycopg.connect(pg_broker.url) as probe:
            statement, params = channel.claim_query([queue], 10, uuid.uuid4())
            explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + statement
            row = probe.execute(explain, params).fetchone()
            probe.rollback()  # the claim ran: leave the messages as they were
        holder.rollback()
    assert row is not None
    plan = row[0][0]["Plan"]
    pages = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    assert plan["Actual Rows"] == 11  # the 10 messages, and the row that carries now()
    assert pages < 200, f"a claim of 10 read {pages} pages, 20,000 consumed behind it"


def _insert(broker: TestBroker, queue: str, count: int, enqueued_ago: float = 0) -> None:
    """``count`` messages on ``queue``, enqueued (and visible) ``enqueued_ago`` seconds ago."""
    with psycopg.connect(broker.url) as conn:
        conn.execute(
            "INSERT INTO saga_broker.messages (queue, body, visible_at, enqueued_at) "
            "SELECT %s, convert_to(repeat('x', 200), 'UTF8'), t, t "
            "FROM generate_series(1, %s), (SELECT now() - %s * interval '1 second') AS s(t)",
            (queue, count, enqueued_ago),
        )
