"""One contract, every broker: :class:`BrokerContract` is the suite each broker passes,
by subclassing it with a ``broker`` fixture (RabbitMQ, Redis and PostgreSQL below; the
in-memory broker in ``test_memory_broker.py``). A test for something a broker cannot do
checks that the broker says so (its capabilities) and that the framework then refuses
or does without, as docs/brokers.md describes.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from kombu import Consumer, Message, Producer

from saga import Outbox
from saga.broker.redis.transport import REGISTRY
from saga.broker.transport import BrokerConfig, Topology, declare_subscriptions
from saga.consumers import DeliveryOutcome
from saga.messaging.envelope import Envelope
from saga.outbox_relay.claims import OutboxRow
from saga.outbox_relay.publisher import BatchPublisher, PublishOutcome
from tests.rig.redis_server import RedisServer
from tests.support import sagas as trips
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.running import running_relay, running_service
from tests.support.samples import ROOT
from tests.support.services import EFFECTS_DDL, Hop, Ping, service
from tests.support.wait import wait_until


def _count(db: TestDatabase, kind: str) -> int:
    return int(db.scalar("SELECT count(*) FROM effects WHERE kind = %s", (kind,)))


def _row(destination: str | None, body: bytes, message_type: str = "Ping") -> OutboxRow:
    return OutboxRow(
        id=int(uuid.uuid4().int % 2**62),
        message_id=uuid.uuid4(),
        destination=destination,
        message_type=message_type,
        body=body,
        attempts=0,
    )


def _publish(broker: TestBroker, rows: list[OutboxRow], **options: Any) -> PublishOutcome:
    """Publish ``rows`` as the relay does (its publisher, on the broker's own connection)."""
    for row in rows:
        if row.destination is not None:
            broker.use(row.destination)
    with broker.config.connected() as conn:
        publisher = BatchPublisher(conn, broker.topology, **options)
        try:
            return publisher.publish(rows)
        finally:
            publisher.close()


@contextlib.contextmanager
def _consuming(broker: TestBroker, *destinations: str) -> Iterator[Callable[[int], list[Message]]]:
    """A consumer on ``destinations``' queues; the callable waits for that many messages in
    all (unacknowledged: the test settles them) and returns every one taken so far."""
    taken: list[Message] = []
    with broker.config.connected() as conn:
        queues = [broker.topology.queue(d) for d in destinations]
        broker.use(*destinations)
        channel = conn.channel()
        for queue in queues:
            queue(channel).declare()
        with Consumer(channel, queues=queues, on_message=taken.append, prefetch_count=100):

            def wait_for(count: int) -> list[Message]:
                def enough() -> bool:
                    if broker.config.capabilities.heartbeats:
                        conn.heartbeat_check()
                    with contextlib.suppress(TimeoutError):
                        conn.drain_events(timeout=0.1)
                    return len(taken) >= count

                wait_until(enough, 60, what=f"{count} message(s) taken")
                return list(taken)

            yield wait_for


def _body(message: Message) -> bytes:
    body = message.body
    return body.encode() if isinstance(body, str) else bytes(body)


class BrokerContract:
    """What every broker must do for the framework. A subclass gives the ``broker``
    fixture (a :class:`TestBroker`); a broker that runs in one process only overrides
    :meth:`take_one_and_die`."""

    @pytest.fixture
    def broker(self) -> Iterator[TestBroker]:
        raise NotImplementedError("a broker's contract test gives its own broker fixture")

    def take_one_and_die(self, broker: TestBroker, destination: str) -> bytes:
        """A consumer in a process of its own takes one message from ``destination``'s
        queue and dies without acknowledging it; the body it took."""
        broker.use(destination)
        died = subprocess.run(
            [sys.executable, "-m", "tests.support.doomed_consumer", broker.url,
             broker.topology.queue_prefix, destination],
            cwd=ROOT, capture_output=True, check=True, timeout=120,
        )  # fmt: skip
        return died.stdout

    # -- through the framework: outbox, relay, consumers ------------------------------

    def test_outbox_to_handler_round_trip(self, db: TestDatabase, broker: TestBroker) -> None:
        db.execute(EFFECTS_DDL)
        with db.connect(autocommit=False) as conn, conn.transaction():
            for i in range(50):
                Outbox().add(conn, Ping(key=f"k{i}", n=i), destination=service.name)
        with running_service(service, db, broker), running_relay(db, broker):
            wait_until(lambda: _count(db, "ping") == 50, what="50 pings handled")
        assert db.scalar("SELECT count(DISTINCT key) FROM effects") == 50
        assert db.scalar("SELECT count(*) FROM saga.outbox") == 0

    def test_chained_messages_keep_their_order(self, db: TestDatabase, broker: TestBroker) -> None:
        db.execute(EFFECTS_DDL)
        with db.connect(autocommit=False) as conn, conn.transaction():
            for chain in ("a", "b", "c"):
                Outbox().add(conn, Hop(chain=chain, seq=1, last=20), destination=service.name)
        with running_service(service, db, broker), running_relay(db, broker):
            wait_until(lambda: _count(db, "hop") == 60, what="three chains of 20")
        for chain in ("a", "b", "c"):
            seqs = [
                r[0]
                for r in db.rows("SELECT seq FROM effects WHERE key = %s ORDER BY id", (chain,))
            ]
            assert seqs == list(range(1, 21))

    def test_duplicate_delivery_is_applied_once(self, db: TestDatabase, broker: TestBroker) -> None:
        db.execute(EFFECTS_DDL)
        body = Envelope.wrap(Ping(key="dup")).to_bytes()
        with running_service(service, db, broker) as runner:
            broker.publish_raw(service.name, body, "application/json")
            broker.publish_raw(service.name, body, "application/json")
            wait_until(lambda: sum(runner.counts.values()) == 2, what="both copies")
            assert runner.counts[DeliveryOutcome.DUPLICATE] == 1
        assert _count(db, "ping") == 1

    def test_non_json_is_rejected_and_recorded(self, db: TestDatabase, broker: TestBroker) -> None:
        db.execute(EFFECTS_DDL)
        with running_service(service, db, broker) as runner:
            broker.publish_raw(service.name, b"<xml/>", "application/xml")
            broker.publish_raw(
                service.name, Envelope.wrap(Ping(key="ok")).to_bytes(), "application/json"
            )
            wait_until(lambda: _count(db, "ping") == 1, what="the good message")
            assert runner.counts[DeliveryOutcome.REJECTED] == 1
        assert db.scalar("SELECT error_type FROM saga.dead_letters") == "ContentTypeRejected"

    def test_an_outbox_delay_holds_the_message_on_every_broker(
        self, db: TestDatabase, broker: TestBroker
    ) -> None:
        db.execute(EFFECTS_DDL)
        with db.connect(autocommit=False) as conn, conn.transaction():
            Outbox().add(
                conn, Ping(key="late"), destination=service.name, deliver_after=timedelta(seconds=1)
            )
            written_at = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        with running_service(service, db, broker), running_relay(db, broker):
            wait_until(lambda: _count(db, "ping") == 1, what="the delayed ping")
        applied_at = db.scalar("SELECT applied_at FROM effects")
        assert applied_at - written_at >= timedelta(seconds=1)

    # -- the broker itself --------------------------------------------------------------

    def test_published_messages_are_claimed_and_acked_once(self, broker: TestBroker) -> None:
        bodies = [b'{"n": %d}' % i for i in range(5)]
        outcome = _publish(broker, [_row("acks", body) for body in bodies])
        assert len(outcome.published) == 5 and not outcome.failed
        with _consuming(broker, "acks") as wait_for:
            taken = wait_for(5)
            assert sorted(_body(m) for m in taken) == sorted(bodies)
            if broker.config.capabilities.multiple_ack:
                taken[-1].ack(multiple=True)
            else:
                for message in taken:
                    message.ack()
        # The consumer is gone: anything it had not settled would be back in the queue.
        depths = broker.config.queue_depths(broker.topology, ["acks"])
        name = broker.topology.queue_name("acks")
        assert name not in depths or depths[name].ready == 0  # an empty queue may be left out

    def test_a_message_whose_consumer_died_is_delivered_again(self, broker: TestBroker) -> None:
        body = b'{"n": "doomed"}'
        assert _publish(broker, [_row("redelivery", body)]).published
        assert self.take_one_and_die(broker, "redelivery") == body
        with _consuming(broker, "redelivery") as wait_for:
            again = wait_for(1)
            assert [_body(m) for m in again] == [body]
            again[0].ack()

    def test_delayed_delivery_is_what_the_capabilities_say(self, broker: TestBroker) -> None:
        """With ``delayed_delivery`` an ``x-delay`` header holds the message back that long;
        without it the header is ignored and the message comes at once (the framework
        then delays in the outbox, as the test above shows)."""
        delayed = broker.config.capabilities.delayed_delivery
        delay_ms = 1500 if delayed else 600_000
        published_at = time.monotonic()
        with broker.config.connected() as conn:
            broker.use("delays")
            channel = conn.channel()
            broker.topology.queue("delays")(channel).declare()
            Producer(channel).publish(
                b'{"n": "late"}',
                exchange="",
                routing_key=broker.topology.queue_name("delays"),
                content_type="application/json",
                headers={"x-delay": delay_ms},
                delivery_mode=2,
            )
        with _consuming(broker, "delays") as wait_for:
            message = wait_for(1)[0]  # without delayed delivery: well before 600 s
            message.ack()
        if delayed:
            assert time.monotonic() - published_at >= delay_ms / 1000

    def test_events_reach_every_subscriber_where_the_broker_carries_them(
        self, broker: TestBroker
    ) -> None:
        row = _row(None, b'{"n": "event"}', message_type="Happened")
        if not broker.config.capabilities.events:
            refused = _publish(broker, [row])
            assert refused.failed[row.id][0] == "EventsNotSupported"
            assert row.id in refused.permanent
            return
        with broker.config.connected() as conn:
            channel = conn.channel()
            for subscriber in ("left", "right"):
                broker.declare(subscriber)
                declare_subscriptions(channel, broker.topology, subscriber, ["Happened"])
        outcome = _publish(broker, [row])
        assert outcome.published == [row.id] and not outcome.unrouted
        with _consuming(broker, "left", "right") as wait_for:
            taken = wait_for(2)
            assert [_body(m) for m in taken] == [row.body, row.body]
            assert {m.delivery_info["routing_key"] for m in taken} == {"Happened"}
            for message in taken:
                message.ack()
        if broker.config.capabilities.returns_unrouted_events:
            nobody = _row(None, b"{}", message_type="NobodyListens")
            assert _publish(broker, [nobody]).unrouted == ["NobodyListens"]

    def test_a_command_for_a_missing_queue_is_returned_or_kept(self, broker: TestBroker) -> None:
        """With ``returns_unroutable`` the relay learns that no queue took the message (and
        keeps its row); without it the broker keeps the message under the queue's name,
        for the queue that is declared later."""
        row = _row("nowhere", b'{"n": "lost?"}')
        outcome = _publish(broker, [row], declare_queues=False)
        if broker.config.capabilities.returns_unroutable:
            assert outcome.failed[row.id][0] == "Unroutable"
            assert not outcome.published
            return
        assert outcome.published == [row.id]
        with _consuming(broker, "nowhere") as wait_for:
            message = wait_for(1)[0]
            assert _body(message) == row.body
            message.ack()

    def test_queue_depths_count_what_waits(self, broker: TestBroker) -> None:
        outcome = _publish(broker, [_row("depths", b'{"n": %d}' % i) for i in range(3)])
        assert len(outcome.published) == 3
        name = broker.topology.queue_name("depths")

        def depths() -> Any:
            found = broker.config.queue_depths(broker.topology, ["depths", "absent"])
            assert broker.topology.queue_name("absent") not in found
            return found.get(name) if found.get(name) and found[name].ready == 3 else None

        depth = wait_until(depths, what="3 messages ready")
        if broker.config.capabilities.queue_details:
            assert (depth.depth, depth.in_flight, depth.delayed) == (3, 0, 0)
            assert depth.oldest_age_s is not None and depth.oldest_age_s >= 0
        else:
            assert (depth.depth, depth.in_flight, depth.delayed) == (None, None, None)


@pytest.mark.rabbitmq
class TestRabbitMQ(BrokerContract):
    @pytest.fixture
    def broker(self, make_broker: Callable[[str], TestBroker]) -> TestBroker:
        return make_broker("amqp")


@pytest.mark.redis
class TestRedis(BrokerContract):
    @pytest.fixture
    def broker(self, make_broker: Callable[[str], TestBroker]) -> TestBroker:
        return make_broker("redis")


class TestPostgreSQL(BrokerContract):
    @pytest.fixture
    def broker(self, make_broker: Callable[[str], TestBroker]) -> TestBroker:
        return make_broker("postgres")


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
