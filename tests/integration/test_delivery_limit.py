"""A message its consumer dies on every time, on a quorum queue: after the delivery limit
it is a dead letter, and the messages queued behind it are handled, each once (taken in
batches again once the consumer got a fresh one).

The consumer is a ``saga consume`` subprocess, started again each time it dies (as a
supervisor would); the queue is a quorum queue on the shared RabbitMQ, of this test only.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from saga.broker.transport import Topology
from saga.examples.order_saga.processes import SagaProcess, saga_env
from saga.messaging.envelope import Envelope
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.services import EFFECTS_DDL, Crash, Ping, effects_per_key, service
from tests.support.wait import wait_until

LIMIT = 3
BEHIND = 30


@pytest.fixture
def quorum(amqp_url: str) -> Iterator[TestBroker]:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    broker = TestBroker(amqp_url, "amqp", Topology(queue_prefix=prefix, queue_type="quorum"))
    yield broker
    broker.cleanup()


def test_a_message_the_consumer_dies_on_is_dead_lettered_after_the_limit_and_the_rest_flow(
    db: TestDatabase, quorum: TestBroker, tmp_path: Path
) -> None:
    db.execute(EFFECTS_DDL)
    poison = Envelope.wrap(Crash(key="poison"))
    behind = [Envelope.wrap(Ping(key=f"b{i:02d}")) for i in range(BEHIND)]
    quorum.declare(service.name)
    quorum.publish_many(service.name, [e.to_bytes() for e in [poison, *behind]])
    env = saga_env(
        db.url,
        quorum.url,
        quorum.topology.queue_prefix,
        SAGA_QUEUE_TYPE="quorum",
        SAGA_DELIVERY_LIMIT=str(LIMIT),
    )
    deaths = 0
    consumer = SagaProcess(["consume", "tests.support.services:service"], env, tmp_path, "c")

    def settled() -> bool:
        nonlocal consumer, deaths
        if consumer.returncode is not None:  # died on the poison: a supervisor restarts it
            deaths += 1
            consumer = SagaProcess(
                ["consume", "tests.support.services:service"], env, tmp_path, "c"
            )
        return effects_per_key(db, "ping") == {e.payload["key"]: 1 for e in behind}

    try:
        wait_until(settled, timeout=120, what="the poison dead-lettered, the rest handled")
    finally:
        code = consumer.terminate(60)
    assert code == 0, consumer.output()
    assert deaths == LIMIT  # it ran the poison LIMIT times, then did not run it again
    letters = db.rows(
        "SELECT message_id, message_type, reason, error_type, error_message, attempts "
        "FROM saga.dead_letters"
    )
    assert letters == [
        (
            poison.message_id,
            "Crash",
            "failed",
            "DeliveryLimitReached",
            f"delivery limit reached after {LIMIT} deliveries",
            LIMIT,
        )
    ]
    assert quorum.depth_once_released(service.name) == 0
    # The poison came alone each time; after the first message behind it, batches again.
    assert db.scalar("SELECT count(DISTINCT xmin::text) FROM public.effects") < BEHIND
