"""The consumer runtime on real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import json
import pickle
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from saga import HandlerContext, RetryPolicy, Service
from saga.consumers import Delivery, DeliveryBatchProcessor, DeliveryOutcome
from saga.examples.order_saga.processes import SagaProcess, saga_env
from saga.messaging.control import FailureReply
from saga.messaging.envelope import Envelope
from saga.outbox_relay import Relay, RelayOptions
from tests.support import servers
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.holds import Hold
from tests.support.running import running_relay, running_service
from tests.support.services import EFFECTS_DDL, Flaky, Ping, Pong, Refuse, service
from tests.support.wait import wait_until

JSON = "application/json"


def _effects(db: TestDatabase, kind: str, key: str) -> int:
    return int(db.scalar("SELECT count(*) FROM effects WHERE kind = %s AND key = %s", (kind, key)))


def _setup(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)


def test_a_message_delivered_twice_is_applied_once(db: TestDatabase, rabbit: TestBroker) -> None:
    _setup(db)
    body = Envelope.wrap(Ping(key="twice")).to_bytes()
    with running_service(service, db, rabbit) as runner:
        rabbit.publish_raw(service.name, body, JSON)
        rabbit.publish_raw(service.name, body, JSON)
        wait_until(lambda: sum(runner.counts.values()) == 2, what="two deliveries")
        assert runner.counts[DeliveryOutcome.HANDLED] == 1
        assert runner.counts[DeliveryOutcome.DUPLICATE] == 1
    assert _effects(db, "ping", "twice") == 1


def test_bad_input_is_rejected_with_a_reason_and_never_blocks(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    _setup(db)
    unknown = Envelope.wrap(Ping(key="x")).model_copy(update={"type": "NoSuchType"})
    with running_service(service, db, rabbit, prefetch=1) as runner:
        rabbit.publish_raw(
            service.name, pickle.dumps({"evil": True}), "application/x-python-serialize"
        )
        rabbit.publish_raw(service.name, unknown.to_bytes(), JSON)
        rabbit.publish_raw(service.name, b'{"message_id": "not json', JSON)
        rabbit.publish_raw(service.name, Envelope.wrap(Ping(key="good")).to_bytes(), JSON)
        wait_until(lambda: _effects(db, "ping", "good") == 1, what="the good message")
        assert runner.counts[DeliveryOutcome.REJECTED] == 3
    letters = db.rows(
        "SELECT reason, error_type, error_message, content_type FROM saga.dead_letters ORDER BY id"
    )
    assert [(r[0], r[1]) for r in letters] == [
        ("rejected", "ContentTypeRejected"),
        ("rejected", "UnknownMessageType"),
        ("rejected", "UndecodableBody"),
    ]
    assert "application/x-python-serialize" in letters[0][2]
    assert "NoSuchType" in letters[1][2]
    assert db.scalar("SELECT count(*) FROM effects") == 1  # no handler ran for the bad three


def test_business_failure_undoes_handler_writes_and_replies(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    _setup(db)
    envelope = Envelope.wrap(Refuse(key="r1")).model_copy(update={"reply_to": "requester"})
    with running_service(service, db, rabbit) as runner:
        rabbit.publish_raw(service.name, envelope.to_bytes(), JSON)
        wait_until(lambda: runner.counts[DeliveryOutcome.BUSINESS_FAILURE] == 1, what="refusal")
    assert db.scalar("SELECT count(*) FROM effects") == 0
    assert db.scalar("SELECT count(*) FROM saga.inbox") == 1
    (message,) = rabbit.receive("requester", 1)  # published by the consumer after its commit
    reply = Envelope.from_bytes(message.body)
    assert reply.type == "saga.FailureReply"
    assert reply.causation_id == envelope.message_id
    assert FailureReply.model_validate(reply.payload).reason == "refusing r1"
    # the consumer stamps when the reply's row committed (for commit-to-commit latency)
    assert reply.created_at.timestamp() <= float(message.headers["committed_at"]) <= time.time()


def test_return_value_is_sent_to_reply_to(db: TestDatabase, rabbit: TestBroker) -> None:
    _setup(db)
    request = Envelope.wrap(Ping(key="p")).model_copy(update={"reply_to": "requester"})
    with running_service(service, db, rabbit), running_relay(db, rabbit):
        rabbit.publish_raw(service.name, request.to_bytes(), JSON)
        (reply,) = rabbit.receive("requester", 1, timeout=20)
    envelope = Envelope.from_bytes(reply.body)
    assert envelope.type == "Pong"
    assert envelope.correlation_id == request.correlation_id
    assert envelope.causation_id == request.message_id


def test_flaky_handler_succeeds_after_immediate_and_delayed_retries(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    _setup(db)
    msg = Envelope.wrap(Flaky(key="f3", fail_times=3))
    with running_service(service, db, rabbit), running_relay(db, rabbit):
        rabbit.publish_raw(service.name, msg.to_bytes(), JSON)
        wait_until(lambda: _effects(db, "flaky-done", "f3") == 1, what="success on try 4")
    assert db.scalar("SELECT seq FROM effects WHERE key = 'f3'") == 4
    assert db.scalar("SELECT count(*) FROM saga.dead_letters") == 0


def test_handler_that_always_fails_is_dead_lettered_after_all_attempts(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    _setup(db)
    msg = Envelope.wrap(Flaky(key="never", fail_times=1000))
    with running_service(service, db, rabbit) as runner, running_relay(db, rabbit):
        rabbit.publish_raw(service.name, msg.to_bytes(), JSON)
        wait_until(lambda: runner.counts[DeliveryOutcome.DEAD_LETTERED] == 1, what="dead letter")
        assert runner.counts[DeliveryOutcome.RETRY_SCHEDULED] == 2
    (row,) = db.rows(
        "SELECT reason, error_type, attempts, message_id, traceback, first_failed_at <= "
        "last_failed_at FROM saga.dead_letters"
    )
    assert row[:4] == ("failed", "RuntimeError", 6, msg.message_id)  # 2 tries x 3 deliveries
    assert "flaky failure" in row[4]
    assert row[5] is True
    assert _effects(db, "flaky-done", "never") == 0


def test_crash_after_commit_before_ack_redelivers_and_applies_once(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    _setup(db)
    env = saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix)
    rabbit.declare(service.name)
    rabbit.publish_raw(service.name, Envelope.wrap(Ping(key="crash")).to_bytes(), JSON)
    args = ["consume", "tests.support.services:service"]
    doomed = SagaProcess(args, {**env, "SAGA_FAULTS": "consumer.after_commit"}, tmp_path, "c1")
    assert doomed.wait(60) == -9, doomed.output()
    assert "fault point consumer.after_commit fired" in doomed.output()
    assert _effects(db, "ping", "crash") == 1
    wait_until(lambda: rabbit.queue_depth(service.name) == 1, what="the unacked message requeued")
    with running_service(service, db, rabbit) as survivor:
        wait_until(lambda: sum(survivor.counts.values()) == 1, what="redelivery handled")
        assert survivor.counts[DeliveryOutcome.DUPLICATE] == 1, (
            survivor.counts
        )  # the inbox caught it
    assert rabbit.queue_depth(service.name) == 0  # acked: stopping the survivor requeued nothing
    assert _effects(db, "ping", "crash") == 1


def test_crash_between_publish_and_delete_delivers_twice_and_applies_once(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    _setup(db)
    with db.connect(autocommit=False) as conn, conn.transaction():
        from saga import Outbox

        Outbox().add(conn, Ping(key="dup"), destination=service.name)
    env = saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix)
    rabbit.declare(service.name)
    doomed = SagaProcess(["relay"], {**env, "SAGA_FAULTS": "relay.after_publish"}, tmp_path, "r1")
    assert doomed.wait(60) == -9, doomed.output()
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 1  # published, never deleted
    assert rabbit.queue_depth(service.name) == 1
    survivor = SagaProcess(["relay"], env, tmp_path, "r2")
    try:
        wait_until(lambda: db.scalar("SELECT count(*) FROM saga.outbox") == 0, what="re-relayed")
    finally:
        assert survivor.terminate() == 0, survivor.output()
    assert rabbit.queue_depth(service.name) == 2  # the broker holds the message twice
    with running_service(service, db, rabbit) as runner:
        wait_until(lambda: sum(runner.counts.values()) == 2, what="both copies handled")
        assert (
            runner.counts[DeliveryOutcome.HANDLED],
            runner.counts[DeliveryOutcome.DUPLICATE],
        ) == (1, 1)
    assert _effects(db, "ping", "dup") == 1


def test_consumer_reconnects_after_losing_its_database_connection(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    _setup(db)
    with running_service(service, db, rabbit):
        rabbit.publish_raw(service.name, Envelope.wrap(Ping(key="one")).to_bytes(), JSON)
        wait_until(lambda: _effects(db, "ping", "one") == 1, what="first message")
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        rabbit.publish_raw(service.name, Envelope.wrap(Ping(key="two")).to_bytes(), JSON)
        wait_until(lambda: _effects(db, "ping", "two") == 1, what="message after reconnect")
    assert _effects(db, "ping", "one") == 1


def test_consumer_reconnects_after_the_broker_closed_its_connection(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    """The broker closes the connection while a handled message is committed and not yet
    acknowledged: the consumer reconnects, skips the redelivered copy (answering it again)
    and handles the message after it."""
    import subprocess

    rabbitmqctl = servers.require_program("rabbitmqctl", servers.RABBITMQCTL_HINT)
    _setup(db)
    rabbit.declare("replies")
    hold = Hold("consumer.after_commit", tmp_path)
    env = saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix)
    consumer = SagaProcess(
        ["consume", "tests.support.services:service"], {**env, **hold.env}, tmp_path, "consumer"
    )
    try:
        one = Envelope.wrap(Ping(key="one"), reply_to="replies")
        rabbit.publish_raw(service.name, one.to_bytes(), JSON)
        hold.wait_held(consumer)
        assert _effects(db, "ping", "one") == 1  # committed, not acknowledged
        subprocess.run(
            [rabbitmqctl, "close_all_connections", "test: broker restart"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        hold.release()  # its acknowledgement goes nowhere: the copy comes back
        rabbit.publish_raw(service.name, Envelope.wrap(Ping(key="two")).to_bytes(), JSON)
        wait_until(
            lambda: (
                _effects(db, "ping", "two") == 1
                and "answered 1 duplicate(s) again" in consumer.output()
            ),
            timeout=60,
            what="the copy skipped and the next message handled after reconnecting",
        )
    finally:
        code = consumer.terminate()
    assert code == 0, consumer.output()
    assert _effects(db, "ping", "one") == 1, consumer.output()


def test_batches_that_deadlock_on_hot_rows_still_finish(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """Two workers whose batches lock the same rows in opposite orders: every message lands."""

    from saga import Service
    from tests.support.services import Hop

    db.execute("CREATE TABLE counters (id int PRIMARY KEY, n int NOT NULL)")
    db.execute("INSERT INTO counters VALUES (1, 0), (2, 0)")
    hot = Service("hot")

    @hot.handler(Hop)
    def bump(tx: Any, msg: Hop, ctx: HandlerContext) -> None:
        first, second = (1, 2) if msg.seq % 2 else (2, 1)
        for row in (first, second):
            tx.execute("UPDATE counters SET n = n + 1 WHERE id = %s", (row,))

    bodies = [Envelope.wrap(Hop(chain="c", seq=i, last=0)).to_bytes() for i in range(300)]
    with running_service(hot, db, rabbit, concurrency=2, prefetch=50) as runner:
        rabbit.publish_many(hot.name, bodies)
        wait_until(lambda: runner.counts[DeliveryOutcome.HANDLED] == 300, timeout=120, what="300")
    assert db.rows("SELECT id, n FROM counters ORDER BY id") == [(1, 300), (2, 300)]
    assert db.scalar("SELECT count(*) FROM saga.dead_letters") == 0


def test_consumer_publishes_what_it_wrote_right_after_commit(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """No relay runs: a chain still advances, each hop published by the consumer itself."""
    from tests.support.services import Hop

    _setup(db)
    first = Envelope.wrap(Hop(chain="fast", seq=1, last=30)).to_bytes()
    with running_service(service, db, rabbit):
        rabbit.publish_raw(service.name, first, JSON)
        wait_until(lambda: _effects(db, "hop", "fast") == 30, what="30 hops without a relay")
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0
    with running_service(service, db, rabbit, publish_after_commit=False):
        rabbit.publish_raw(
            service.name, Envelope.wrap(Hop(chain="slow", seq=1, last=3)).to_bytes(), JSON
        )
        wait_until(lambda: db.scalar("SELECT count(*) FROM saga.outbox") == 1, what="left to relay")
    assert _effects(db, "hop", "slow") == 1


def test_rows_of_a_publish_after_commit_the_broker_nacked_stay_for_the_relay(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """A handler sends two messages to a queue with room for one (``reject-publish``): the
    consumer publishes them right after commit and RabbitMQ nacks the second. The consumer
    deletes the row RabbitMQ confirmed and hands the nacked one to the relays at once
    (its lease released), and the relay sends it later: each message arrives exactly once."""
    rabbit.topology = replace(
        rabbit.topology, queue_arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    )
    splitter = Service("splitter")

    @splitter.handler(Ping)
    def split(tx: Any, msg: Ping, ctx: HandlerContext) -> None:
        for side in ("left", "right"):
            ctx.send(Pong(key=f"{msg.key}-{side}"), to="capped")

    rabbit.use("capped")
    with running_service(splitter, db, rabbit) as runner:
        rabbit.publish_raw(splitter.name, Envelope.wrap(Ping(key="p")).to_bytes(), JSON)
        wait_until(lambda: runner.counts[DeliveryOutcome.HANDLED] == 1, what="the ping handled")
    assert rabbit.queue_depth("capped") == 1  # the first got in; the second was nacked
    # the confirmed row is gone; the nacked one stays, no longer leased to the consumer
    assert db.rows("SELECT deliver_after IS NULL FROM saga.outbox") == [(True,)]
    received: list[str] = []
    with Relay(db.url, rabbit.config, RelayOptions(retry_base_delay=0.0), rabbit.topology) as relay:
        while db.scalar("SELECT count(*) FROM saga.outbox"):
            received += [json.loads(m.body)["payload"]["key"] for m in rabbit.receive("capped", 1)]
            relay.promote_due()
            relay.relay_batch()
    received += [json.loads(m.body)["payload"]["key"] for m in rabbit.receive("capped", 1)]
    assert sorted(received) == ["p-left", "p-right"]


def test_one_batch_commits_each_delivery_on_its_own_merits(db: TestDatabase) -> None:
    _setup(db)
    ping = Envelope.wrap(Ping(key="a")).to_bytes()
    failing = Envelope.wrap(Flaky(key="f", fail_times=1000))
    batch = [
        Delivery(ping, JSON),
        Delivery(ping, JSON),  # a second copy in the same batch
        Delivery(Envelope.wrap(Refuse(key="r")).to_bytes(), JSON),
        Delivery(failing.to_bytes(), JSON),
        Delivery(Envelope.wrap(Ping(key="b")).to_bytes(), JSON),
        Delivery(b"junk", JSON),
    ]
    processor = DeliveryBatchProcessor(service)
    with db.connect(autocommit=False) as conn:
        outcomes = processor.process(conn, batch)
        assert outcomes == [
            DeliveryOutcome.HANDLED,
            DeliveryOutcome.DUPLICATE,
            DeliveryOutcome.BUSINESS_FAILURE,
            DeliveryOutcome.RETRY_SCHEDULED,
            DeliveryOutcome.HANDLED,
            DeliveryOutcome.REJECTED,
        ]
        # the retry carries the same message id: its inbox row went, so it gets through
        retry = Delivery(failing.with_headers(attempt="2").to_bytes(), JSON)
        assert processor.process(conn, [retry]) == [DeliveryOutcome.RETRY_SCHEDULED]
    assert [_effects(db, "ping", k) for k in ("a", "b")] == [1, 1]
    assert db.scalar("SELECT count(*) FROM effects WHERE kind <> 'ping'") == 0
    assert db.scalar("SELECT count(*) FROM saga.inbox") == 3  # a, b and the refusal
    assert (
        db.scalar("SELECT count(*) FROM saga.outbox WHERE message_id = %s", (failing.message_id,))
        == 2
    )


class Deterministic(BaseModel):
    """A command that fails the same way on every try: ``fault`` says how."""

    key: str
    fault: str


def _fail_deterministically(tx: Any, msg: Deterministic, ctx: HandlerContext) -> Pong:
    if msg.fault == "sql":
        tx.execute("SELECT no_such_column FROM public.effects")
    tx.execute("INSERT INTO public.effects (kind, key) VALUES ('deterministic', %s)", (msg.key,))
    return Pong(key=msg.key)  # with no reply_to: a ConfigurationError


def _deterministic_service(policy: RetryPolicy) -> Service:
    svc = Service("deterministic", retry=policy)
    svc.handler(Deterministic)(_fail_deterministically)
    return svc


DETERMINISTIC_FAULTS = [
    ("nul\x00in text", "nul", "DataError"),  # psycopg refuses a NUL character in a text field
    ("bad-sql", "sql", "UndefinedColumn"),  # a ProgrammingError
    ("no-reply-to", "reply", "ConfigurationError"),  # a reply without reply_to
]


@pytest.mark.parametrize(("key", "fault", "error_type"), DETERMINISTIC_FAULTS)
def test_a_deterministic_failure_is_dead_lettered_at_once(
    db: TestDatabase, key: str, fault: str, error_type: str
) -> None:
    _setup(db)
    patient = RetryPolicy(immediate_attempts=3, immediate_initial_wait=0.0, delays=(0.05, 0.05))
    envelope = Envelope.wrap(Deterministic(key=key, fault=fault))
    processor = DeliveryBatchProcessor(_deterministic_service(patient))
    with db.connect(autocommit=False) as conn:
        assert processor.process(conn, [Delivery(envelope.to_bytes(), JSON)]) == [
            DeliveryOutcome.DEAD_LETTERED
        ]
    (row,) = db.rows("SELECT message_id, error_type, attempts FROM saga.dead_letters")
    assert row == (envelope.message_id, error_type, 1)  # one try, no delayed retry
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0
    assert db.scalar("SELECT count(*) FROM saga.inbox") == 0
    assert db.scalar("SELECT count(*) FROM public.effects") == 0


def test_a_policy_can_retry_deterministic_failures_too(db: TestDatabase) -> None:
    _setup(db)
    stubborn = RetryPolicy(
        immediate_attempts=2, immediate_initial_wait=0.0, delays=(0.05,), deterministic=()
    )
    envelope = Envelope.wrap(Deterministic(key="no-reply-to", fault="reply"))
    processor = DeliveryBatchProcessor(_deterministic_service(stubborn))
    with db.connect(autocommit=False) as conn:
        first = processor.process(conn, [Delivery(envelope.to_bytes(), JSON)])
        again = Delivery(envelope.with_headers(attempt="2").to_bytes(), JSON)
        assert (first, processor.process(conn, [again])) == (
            [DeliveryOutcome.RETRY_SCHEDULED],
            [DeliveryOutcome.DEAD_LETTERED],
        )
    assert db.rows("SELECT error_type, attempts FROM saga.dead_letters") == [
        ("ConfigurationError", 4)  # 2 tries x 2 deliveries
    ]


@pytest.mark.parametrize("run", ["first", "second"])
def test_tries_are_counted_afresh_in_every_test(db: TestDatabase, run: str) -> None:
    """Both runs fail once, then succeed: no try counted by the other run carries over."""
    _setup(db)
    flaky = Envelope.wrap(Flaky(key="counted-per-test", fail_times=1)).to_bytes()
    with db.connect(autocommit=False) as conn:
        assert DeliveryBatchProcessor(service).process(conn, [Delivery(flaky, JSON)]) == [
            DeliveryOutcome.HANDLED
        ]
    assert db.rows("SELECT seq FROM effects WHERE kind = 'flaky-done'") == [(2,)]  # 2nd try
