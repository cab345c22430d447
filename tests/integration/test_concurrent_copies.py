"""Two copies of one message in two batches open at the same time, in two processes.

The first copy's batch is held before its commit (its inbox row written, not yet
committed); the second copy reaches another consumer's batch, whose inbox insert must
wait for the first. When the first commits, the second is a duplicate: one effect.
"""

from __future__ import annotations

import signal
from pathlib import Path

from saga.consumers import DeliveryOutcome
from saga.examples.order_saga.processes import SagaProcess, saga_env
from saga.messaging.envelope import Envelope
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.holds import Hold
from tests.support.running import running_service
from tests.support.services import EFFECTS_DDL, Ping, service
from tests.support.wait import wait_until

JSON = "application/json"


def test_two_copies_in_two_concurrent_batches_apply_one_effect(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    db.execute(EFFECTS_DDL)
    copy = Envelope.wrap(Ping(key="twice")).to_bytes()
    rabbit.publish_raw(service.name, copy, JSON)
    hold = Hold("consumer.before_commit", tmp_path)
    first = SagaProcess(
        ["consume", "tests.support.services:service", "--prefetch", "1"],  # takes one only
        {**saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix), **hold.env},
        tmp_path,
        "first",
    )
    hold.wait_held(first)  # the first copy handled, its inbox row not committed
    other = Envelope.wrap(Ping(key="other")).to_bytes()
    rabbit.publish_many(service.name, [copy, other])  # the second copy, with a message behind
    with running_service(service, db, rabbit) as second:
        wait_until(lambda: db.waiting_on_locks() == 1, what="the second copy waiting")
        assert db.scalar("SELECT count(*) FROM effects") == 0
        hold.release()
        wait_until(lambda: sum(second.counts.values()) == 2, what="both of its deliveries")
        assert (
            second.counts[DeliveryOutcome.DUPLICATE],
            second.counts[DeliveryOutcome.HANDLED],
        ) == (1, 1)
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0, first.output()
    assert db.rows("SELECT key, count(*) FROM effects GROUP BY key ORDER BY key") == [
        ("other", 1),
        ("twice", 1),
    ]
    assert rabbit.depth_once_released(service.name) == 0
