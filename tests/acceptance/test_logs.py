"""Structured logs from a real consumer process: JSON lines carrying the message's context."""

from __future__ import annotations

import json
from pathlib import Path

from saga.examples.order_saga.processes import SagaProcess, saga_env
from saga.messaging.envelope import Envelope
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.services import EFFECTS_DDL, Flaky, service
from tests.support.wait import wait_until


def test_json_logs_name_the_consumer_message_and_saga(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    db.execute(EFFECTS_DDL)
    rabbit.declare(service.name)
    failing = Envelope.wrap(
        Flaky(key="logged", fail_times=1000),
        saga_id=Envelope.wrap(Flaky(key="x", fail_times=0)).message_id,
    )
    env = saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix, SAGA_LOG_FORMAT="json")
    consumer = SagaProcess(["consume", "tests.support.services:service"], env, tmp_path, "c")
    relay = SagaProcess(["relay"], env, tmp_path, "r")
    try:
        rabbit.publish_raw(service.name, failing.to_bytes(), "application/json")
        wait_until(lambda: db.scalar("SELECT count(*) FROM saga.dead_letters") == 1, what="dlq")
    finally:
        assert consumer.terminate() == 0
        assert relay.terminate() == 0
    lines = [json.loads(line) for line in consumer.output().splitlines() if line.startswith("{")]
    about = [line for line in lines if line.get("message_id") == str(failing.message_id)]
    assert len(about) >= 3  # two retries scheduled, one dead-lettered
    assert all(line["consumer"] == service.name for line in about)
    assert all(line["saga_id"] == str(failing.saga_id) for line in about)
    assert any(line["level"] == "ERROR" and "dead-lettered" in line["message"] for line in about)
