"""SIGTERM while a batch is inside its transaction: the batch finishes, then the process stops.

Each process is held at a fault point inside its batch's transaction (after the
relay published, before the consumer commits), gets SIGTERM there, says it is
stopping, and only then is let go. The batch in hand must be whole (committed,
and published or acknowledged), nothing after it started, and the exit code 0.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from saga import Outbox
from saga.examples.order_saga.processes import SagaProcess, saga_env
from saga.messaging.envelope import Envelope
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.holds import Hold
from tests.support.services import EFFECTS_DDL, Ping, service

JSON = "application/json"
STOPPING = "SIGTERM: stopping after the work in hand"
ROWS = 120
BATCH = 50


def _stop_while_held(process: SagaProcess, hold: Hold) -> int:
    """SIGTERM the held process, wait until it has taken the signal, release it; its exit."""
    hold.wait_held(process)
    process.proc.send_signal(signal.SIGTERM)
    process.wait_for_output(STOPPING, 30)
    assert process.returncode is None, process.output()  # still holding its batch
    hold.release()
    return process.wait(60)


def test_relay_sigterm_mid_batch_deletes_what_it_published_then_exits_zero(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    with db.connect(autocommit=False) as conn, conn.transaction():
        for i in range(ROWS):
            Outbox().add(conn, Ping(key=f"r{i}"), destination="notes")
    rabbit.declare("notes")
    hold = Hold("relay.after_publish", tmp_path)
    relay = SagaProcess(
        ["relay", "--batch-size", str(BATCH)],
        {**saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix), **hold.env},
        tmp_path,
        "relay",
    )
    hold.wait_held(relay)
    assert rabbit.queue_depth("notes") == BATCH  # published: the broker took the batch
    assert db.scalar("SELECT count(*) FROM saga.outbox") == ROWS  # not deleted yet
    assert _stop_while_held(relay, hold) == 0, relay.output()
    # The batch in hand was deleted and committed; no batch was started after the signal.
    assert db.scalar("SELECT count(*) FROM saga.outbox") == ROWS - BATCH
    keys = [json.loads(m.body)["payload"]["key"] for m in rabbit.receive("notes", BATCH)]
    assert keys == [f"r{i}" for i in range(BATCH)]
    assert rabbit.queue_depth("notes") == 0  # each published once


def test_consumer_sigterm_mid_batch_commits_acks_and_publishes_it_then_exits_zero(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    db.execute(EFFECTS_DDL)
    rabbit.use("replies")
    sent = [Envelope.wrap(Ping(key=f"c{i}"), reply_to="replies") for i in range(5)]
    rabbit.publish_many(service.name, [e.to_bytes() for e in sent])
    hold = Hold("consumer.before_commit", tmp_path)
    consumer = SagaProcess(
        ["consume", "tests.support.services:service", "--prefetch", "10"],
        {**saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix), **hold.env},
        tmp_path,
        "consumer",
    )
    hold.wait_held(consumer)
    assert db.scalar("SELECT count(*) FROM effects") == 0  # handled, not committed
    assert _stop_while_held(consumer, hold) == 0, consumer.output()
    batch = db.scalar("SELECT count(*) FROM effects")
    assert batch >= 1
    assert db.scalar("SELECT count(*) FROM saga.inbox") == batch
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0  # its replies went out
    assert db.scalar("SELECT count(*) FROM saga.dead_letters") == 0
    replies = rabbit.receive("replies", batch)
    assert sorted(json.loads(m.body)["payload"]["key"] for m in replies) == sorted(
        e.payload["key"] for e in sent[:batch]
    )
    assert rabbit.queue_depth("replies") == 0
    # Acknowledged: only the deliveries the batch had not started went back to the queue.
    assert rabbit.depth_once_released(service.name) == len(sent) - batch
