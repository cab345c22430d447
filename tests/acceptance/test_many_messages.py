"""Two relays and two consumer processes move 20,000 messages across 200 sagas.

Each saga is a chain of 100 messages: the handler of message n sends message
n + 1 through the outbox, in the same transaction as its effect, so the
saga always has exactly one message outstanding (the framework's ordering
rule). All processes are real ``saga`` subprocesses on PostgreSQL and RabbitMQ.
"""

from __future__ import annotations

import time
from pathlib import Path

from saga import Outbox, uuid7
from saga.examples.order_saga.processes import SagaProcess, saga_env
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.services import EFFECTS_DDL, Hop, service
from tests.support.wait import wait_until

SAGAS = 200
PER_SAGA = 100


def test_two_relays_two_consumers_twenty_thousand_messages(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    db.execute(EFFECTS_DDL)
    rabbit.declare(service.name)
    outbox = Outbox()
    with db.connect(autocommit=False) as conn, conn.transaction():
        for i in range(SAGAS):
            outbox.add(
                conn,
                Hop(chain=f"saga-{i:03d}", seq=1, last=PER_SAGA),
                destination=service.name,
                saga_id=uuid7(),
            )
    env = saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix)
    started = time.monotonic()
    processes = [
        SagaProcess(["relay", "--batch-size", "200"], env, tmp_path, "relay-1"),
        SagaProcess(["relay", "--batch-size", "200"], env, tmp_path, "relay-2"),
        SagaProcess(["consume", "tests.support.services:service"], env, tmp_path, "consumer-1"),
        SagaProcess(["consume", "tests.support.services:service"], env, tmp_path, "consumer-2"),
    ]
    try:
        wait_until(
            lambda: db.scalar("SELECT count(*) FROM effects") >= SAGAS * PER_SAGA,
            timeout=400,
            interval=0.5,
            what="20,000 effects",
        )
        elapsed = time.monotonic() - started
        wait_until(lambda: db.scalar("SELECT count(*) FROM saga.outbox") == 0, what="empty outbox")
    finally:
        codes = {p.name: p.terminate(60) for p in processes}
    assert codes == {p.name: 0 for p in processes}, [p.output()[-2000:] for p in processes]

    total, distinct = db.rows("SELECT count(*), count(DISTINCT (key, seq)) FROM effects")[0]
    assert (total, distinct) == (SAGAS * PER_SAGA, SAGAS * PER_SAGA)  # no effect applied twice
    out_of_order = db.scalar(
        """
        SELECT count(*) FROM (
            SELECT seq, row_number() OVER (PARTITION BY key ORDER BY id) AS position
            FROM effects
        ) ordered WHERE seq <> position
        """
    )
    assert out_of_order == 0
    pids = db.scalar("SELECT count(DISTINCT pid) FROM effects")
    assert pids >= 2  # both consumer processes did work
    print(f"\n20,000 messages in {elapsed:.1f}s: {SAGAS * PER_SAGA / elapsed:.0f} msg/s end to end")
