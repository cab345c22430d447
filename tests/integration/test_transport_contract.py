"""One contract, every transport: memory, RabbitMQ (amqp), Redis and PostgreSQL.

Each test here runs once per transport through the ``any_broker`` fixture.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
from kombu import Consumer, Message, Producer

from saga import Outbox
from saga.broker.redis.transport import REGISTRY
from saga.broker.transport import BrokerConfig, Topology
from saga.consumers import Outcome
from saga.examples.order_saga.redis_server import RedisServer
from saga.messaging.envelope import Envelope
from tests.support import sagas as trips
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.running import running_relay, running_service
from tests.support.services import EFFECTS_DDL, Hop, Ping, service
from tests.support.wait import wait_until


def _count(db: TestDatabase, kind: str) -> int:
    return int(db.scalar("SELECT count(*) FROM effects WHERE kind = %s", (kind,)))


def test_outbox_to_handler_round_trip(db: TestDatabase, any_broker: TestBroker) -> None:
    db.execute(EFFECTS_DDL)
    with db.connect(autocommit=False) as conn, conn.transaction():
        for i in range(50):
            Outbox().add(conn, Ping(key=f"k{i}", n=i), destination=service.name)
    with running_service(service, db, any_broker), running_relay(db, any_broker):
        wait_until(lambda: _count(db, "ping") == 50, what="50 pings handled")
    assert db.scalar("SELECT count(DISTINCT key) FROM effects") == 50
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0


def test_chained_messages_keep_their_order(db: TestDatabase, any_broker: TestBroker) -> None:
    db.execute(EFFECTS_DDL)
    with db.connect(autocommit=False) as conn, conn.transaction():
        for chain in ("a", "b", "c"):
            Outbox().add(conn, Hop(chain=chain, seq=1, last=20), destination=service.name)
    with running_service(service, db, any_broker), running_relay(db, any_broker):
        wait_until(lambda: _count(db, "hop") == 60, what="three chains of 20")
    for chain in ("a", "b", "c"):
        seqs = [
            r[0] for r in db.rows("SELECT seq FROM effects WHERE key = %s ORDER BY id", (chain,))
        ]
        assert seqs == list(range(1, 21))


def test_duplicate_delivery_is_applied_once(db: TestDatabase, any_broker: TestBroker) -> None:
    db.execute(EFFECTS_DDL)
    body = Envelope.wrap(Ping(key="dup")).to_bytes()
    with running_service(service, db, any_broker) as runner:
        any_broker.publish_raw(service.name, body, "application/json")
        any_broker.publish_raw(service.name, body, "application/json")
        wait_until(lambda: sum(runner.counts.values()) == 2, what="both copies")
        assert runner.counts[Outcome.DUPLICATE] == 1
    assert _count(db, "ping") == 1


def test_non_json_is_rejected_and_recorded(db: TestDatabase, any_broker: TestBroker) -> None:
    db.execute(EFFECTS_DDL)
    with running_service(service, db, any_broker) as runner:
        any_broker.publish_raw(service.name, b"<xml/>", "application/xml")
        any_broker.publish_raw(
            service.name, Envelope.wrap(Ping(key="ok")).to_bytes(), "application/json"
        )
        wait_until(lambda: _count(db, "ping") == 1, what="the good message")
        assert runner.counts[Outcome.REJECTED] == 1
    assert db.scalar("SELECT error_type FROM saga.dead_letters") == "ContentTypeRejected"


def test_delayed_message_arrives_after_its_delay(db: TestDatabase, any_broker: TestBroker) -> None:
    db.execute(EFFECTS_DDL)
    with db.connect(autocommit=False) as conn, conn.transaction():
        Outbox().add(
            conn, Ping(key="late"), destination=service.name, deliver_after=timedelta(seconds=1)
        )
        written_at = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    with running_service(service, db, any_broker), running_relay(db, any_broker):
        wait_until(lambda: _count(db, "ping") == 1, what="the delayed ping")
    applied_at = db.scalar("SELECT applied_at FROM effects")
    assert applied_at - written_at >= timedelta(seconds=1)


# -- A Redis restart (a private redis-server each: the shared one is never restarted) -----


def _pings(db: TestDatabase, count: int, first: int = 0) -> None:
    with db.connect(autocommit=False) as conn, conn.transaction():
        for i in range(first, first + count):
            Outbox().add(conn, Ping(key=f"k{i}", n=i), destination=service.name)


def _outbox_empty(db: TestDatabase) -> bool:
    return db.scalar("SELECT count(*) FROM saga.outbox") == 0


def test_a_persistent_redis_restart_loses_nothing(
    db: TestDatabase,
    private_redis: Callable[..., RedisServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis crashes after taking messages and while relay and consumer are connected:
    both reconnect, and every message the relay handed over is still delivered, once."""
    db.execute(EFFECTS_DDL)
    server = private_redis(persistent=True)
    broker = TestBroker(server.url, "redis")
    with running_relay(db, broker):
        _pings(db, 200)
        wait_until(lambda: _outbox_empty(db), what="the first 200 published")
        server.crash()
        _pings(db, 200, first=200)  # their publish fails midway: uncertain, so not published
        wait_until(lambda: "relay lost a connection" in caplog.text, what="a failed publish")
        server.start()
        wait_until(lambda: _outbox_empty(db), what="the next 200 published")
    with running_service(service, db, broker) as runner, running_relay(db, broker):
        wait_until(lambda: _count(db, "ping") == 400, what="400 pings")
        server.restart()  # the consumer's and the relay's connections die under them
        _pings(db, 100, first=400)
        wait_until(lambda: _count(db, "ping") == 500, what="100 more pings after the restart")
        assert runner.failure is None
    assert db.scalar("SELECT count(DISTINCT key) FROM effects") == 500


def _saga_statuses(db: TestDatabase) -> dict[str, int]:
    rows = db.rows("SELECT status, count(*) FROM saga.saga_instances GROUP BY 1")
    return {status: int(number) for status, number in rows}


def test_sagas_stranded_by_a_redis_without_persistence_are_recovered_by_bulk_resume(
    db: TestDatabase, private_redis: Callable[..., RedisServer]
) -> None:
    """The relay hands 30 commands to a Redis that forgets; Redis restarts; one
    ``saga resume`` brings every saga to its end, each effect applied once."""
    db.execute(EFFECTS_DDL)
    server = private_redis(persistent=False)
    broker = TestBroker(server.url, "redis", accepts_message_loss=True)
    with db.connect(autocommit=False) as conn, conn.transaction():
        for i in range(30):
            trips.trip.start(conn, trips.TripData(trip_id=f"lost-{i}"))
    with running_relay(db, broker):
        wait_until(lambda: _outbox_empty(db), what="30 charge commands handed to Redis")
    server.restart()  # no persistence: the 30 commands are gone
    with (
        running_relay(db, broker),
        running_service(trips.registry.as_service(), db, broker),
        running_service(trips.bank, db, broker),
    ):
        assert _saga_statuses(db) == {"running": 30}
        dry = saga_cli(db.url, "resume", "--stuck-after", "0s", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "dry run: 30 saga(s) to resume" in dry.stdout
        assert _count(db, "charge") == 0 and _outbox_empty(db)
        other = saga_cli(db.url, "resume", "--stuck-after", "0s", "--name", "other_saga")
        assert "0 saga(s) to resume" in other.stdout
        result = saga_cli(db.url, "resume", "--stuck-after", "0s", "--reason", "redis lost")
        assert result.returncode == 0, result.stderr
        assert "resumed 30 saga(s): 30 to 'trips'" in result.stdout
        wait_until(lambda: _saga_statuses(db) == {"completed": 30}, what="30 completed")
    for kind in ("open", "charge", "confirm"):
        assert db.scalar(
            "SELECT count(DISTINCT key) = 30 AND count(*) = 30 FROM effects WHERE kind = %s",
            (kind,),
        ), kind


def test_a_message_redis_took_for_a_consumer_whose_reply_was_lost_is_delivered_again(
    private_redis: Callable[..., RedisServer],
) -> None:
    """Redis takes a message for a waiting consumer (and writes that to its append-only
    file); the reply never reaches it (its connection dies unread), and Redis crashes.
    The message is not lost: another consumer gets it once the first one's heartbeat
    has expired, and afterwards nothing is left in Redis."""
    server = private_redis(persistent=True)
    config = BrokerConfig(server.url, visibility_timeout=2)
    queue = Topology(queue_prefix=f"t{uuid.uuid4().hex[:10]}.").queue("svc")
    redis_client = redis.Redis.from_url(server.url)
    doomed = config.connect()
    channel = doomed.channel()
    Consumer(channel, queues=[queue], accept=["application/json"]).consume()
    with pytest.raises(TimeoutError):
        doomed.drain_events(timeout=0.05)  # the take is sent; nothing to take yet
    with config.connect() as publisher:
        Producer(publisher.channel()).publish(
            {"n": 1}, exchange="", routing_key=queue.name, serializer="json"
        )
    wait_until(lambda: redis_client.llen(queue.name) == 0, what="Redis took the message")
    channel.client.connection._sock.close()  # the consumer's connection dies, reply unread
    server.restart()
    received: list[Any] = []

    def on_message(body: Any, message: Message) -> None:
        received.append(body)
        message.ack()

    with config.connect() as survivor:
        Consumer(
            survivor.channel(), queues=[queue], callbacks=[on_message], accept=["application/json"]
        ).consume()

        def delivered() -> bool:
            with contextlib.suppress(TimeoutError):
                survivor.drain_events(timeout=0.2)
            return bool(received)

        wait_until(delivered, 30, what="the message Redis took for the lost consumer")
    assert received == [{"n": 1}]
    redis_client = redis.Redis.from_url(server.url)
    assert redis_client.llen(queue.name) == 0 and redis_client.hlen("unacked") == 0
    lists = redis_client.hkeys(REGISTRY)
    assert lists and all(redis_client.llen(key) == 0 for key in lists)
    doomed.release()  # before the private server stops: nothing of it is left to restore
