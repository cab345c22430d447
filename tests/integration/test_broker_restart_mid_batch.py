"""RabbitMQ restarts while a relay's batch, then a consumer's, is in the middle of its
transaction: nothing is lost and no effect is applied twice.

The broker is a private node (its own node name, ports and folders: the shared server
is never touched). Each process is held at a fault point inside its batch, the node is
stopped and started again under it, then the process is let go.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from saga import Outbox
from saga.examples.order_saga.processes import SagaProcess, saga_env
from saga.messaging.envelope import Envelope
from tests.rig.rabbitmq_cluster import (
    RABBITMQ_BIN,
    RabbitCluster,
    rabbitmq_installed,
)
from tests.support import servers
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.holds import Hold
from tests.support.services import EFFECTS_DDL, Ping, service
from tests.support.wait import wait_until

pytestmark = pytest.mark.rabbitmq  # a private node of its own (the shared one is never restarted)

ROWS = 40
_ANSWERED = re.compile(r"answered (\d+) duplicate\(s\) again")


@pytest.fixture(scope="module")
def private_node() -> Iterator[RabbitCluster]:
    if not rabbitmq_installed():
        servers.unavailable("rabbitmq-server", f"{servers.RABBITMQCTL_HINT} ({RABBITMQ_BIN})")
    node = RabbitCluster(size=1)
    node.start()
    try:
        yield node
    finally:
        node.close()


@pytest.fixture
def broker(private_node: RabbitCluster) -> Iterator[TestBroker]:
    broker = TestBroker(private_node.nodes[0].url, "amqp")
    yield broker
    broker.cleanup()


def _restart(node: RabbitCluster) -> None:
    node.stop_node(node.nodes[0])
    node.start_node(node.nodes[0])


def _keys(messages: list[object]) -> list[str]:
    return [json.loads(m.body)["payload"]["key"] for m in messages]  # type: ignore[attr-defined]


def test_a_relay_batch_claimed_when_the_broker_restarts_is_published_once_after_it(
    db: TestDatabase, broker: TestBroker, private_node: RabbitCluster, tmp_path: Path
) -> None:
    with db.connect(autocommit=False) as conn, conn.transaction():
        for i in range(ROWS):
            Outbox().add(conn, Ping(key=f"r{i:02d}"), destination="notes")
    broker.declare("notes")
    hold = Hold("relay.after_claim", tmp_path)  # the rows locked, nothing published yet
    relay = SagaProcess(
        ["relay"],
        {**saga_env(db.url, broker.url, broker.topology.queue_prefix), **hold.env},
        tmp_path,
        "relay",
    )
    try:
        hold.wait_held(relay)
        _restart(private_node)  # the relay's connection is gone when it publishes
        hold.release()
        wait_until(
            lambda: db.scalar("SELECT count(*) FROM saga.outbox") == 0,
            timeout=120,
            what="the batch published after the relay reconnected",
        )
    finally:
        assert relay.terminate(60) == 0, relay.output()
    assert sorted(_keys(broker.receive("notes", ROWS))) == [f"r{i:02d}" for i in range(ROWS)]
    assert broker.queue_depth("notes") == 0  # and each went out once
    assert "reconnecting" in relay.output()  # the publish did fail on the lost connection


def test_a_consumer_batch_handled_when_the_broker_restarts_commits_once_and_loses_nothing(
    db: TestDatabase, broker: TestBroker, private_node: RabbitCluster, tmp_path: Path
) -> None:
    db.execute(EFFECTS_DDL)
    sent = [Envelope.wrap(Ping(key=f"c{i}"), reply_to="replies") for i in range(5)]
    broker.declare("replies")
    broker.publish_many(service.name, [envelope.to_bytes() for envelope in sent])
    hold = Hold("consumer.before_commit", tmp_path)  # handled, not committed, not acked
    env = saga_env(db.url, broker.url, broker.topology.queue_prefix)
    consumer = SagaProcess(
        ["consume", "tests.support.services:service"], {**env, **hold.env}, tmp_path, "consumer"
    )
    relay = SagaProcess(["relay"], env, tmp_path, "relay")  # for replies left behind
    try:
        hold.wait_held(consumer)
        _restart(private_node)  # its deliveries go back to the queue, unacknowledged
        hold.release()  # it commits, then cannot acknowledge on the lost channel
        wait_until(
            lambda: (
                db.scalar("SELECT count(*) FROM effects") == len(sent)
                and db.scalar("SELECT count(*) FROM saga.outbox") == 0
                and broker.queue_depth(service.name) == 0
                and _ANSWERED.search(consumer.output()) is not None
            ),
            timeout=120,
            what="every delivery handled, a redelivered copy answered again, every reply out",
        )
    finally:
        codes = {p.name: p.terminate(60) for p in (consumer, relay)}
    assert codes == {"consumer": 0, "relay": 0}, [consumer.output(), relay.output()]
    # Its acknowledgement was lost with the connection; the redelivered copies were skipped
    # and answered again. The held batch holds what had arrived when it began: one to all.
    assert "reconnecting" in consumer.output()
    answered = sum(int(n) for n in _ANSWERED.findall(consumer.output()))
    assert 1 <= answered <= len(sent), consumer.output()
    assert db.rows("SELECT key, count(*) FROM effects GROUP BY key ORDER BY key") == [
        (f"c{i}", 1) for i in range(len(sent))
    ]
    # One reply each, plus one for each copy answered again: out, or in the outbox when a
    # batch the stop let finish came after the relay's last poll.
    expected = len(sent) + answered - db.scalar("SELECT count(*) FROM saga.outbox")
    replies = broker.receive("replies", expected, timeout=30)
    assert sorted(set(_keys(replies))) == [f"c{i}" for i in range(len(sent))]  # none lost
    assert len(replies) == expected
    # Copies redelivered after the restart and not yet started when the consumer stopped
    # went back to the queue (as a stop hands them back): any left are duplicates.
