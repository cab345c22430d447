"""``saga consume --relay``: one process that consumes and relays its database's outbox.

The messages are written by a transaction of the service's own (as an API's would be),
not by a consumer's batch, so nothing but a relay publishes them; and no ``saga relay``
process runs.
"""

from __future__ import annotations

from pathlib import Path

from saga import Outbox
from saga.examples.order_saga.processes import SagaProcess, saga_env
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.services import EFFECTS_DDL, Ping, effects_per_key, service
from tests.support.wait import wait_until

TARGET = "tests.support.services:service"


def test_a_consumer_with_relay_publishes_what_its_own_transactions_wrote(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    db.execute(EFFECTS_DDL)
    rabbit.declare(service.name)
    env = saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix)
    consumer = SagaProcess(["consume", "--relay", TARGET], env, tmp_path, "consumer")
    keys = [f"k{i}" for i in range(20)]
    try:
        with db.connect(autocommit=True) as conn, conn.transaction():
            for key in keys:
                Outbox().add(conn, Ping(key=key), destination=service.name)
        wait_until(
            lambda: effects_per_key(db, "ping") == dict.fromkeys(keys, 1),
            timeout=60,
            what="every ping relayed and handled once",
        )
        wait_until(lambda: db.scalar("SELECT count(*) FROM saga.outbox") == 0, what="drained")
    finally:
        code = consumer.terminate(60)
    assert code == 0, consumer.output()
    assert "relay stopped" in consumer.output(), consumer.output()
