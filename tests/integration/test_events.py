"""Events: published once in a transaction, handled once by every subscriber.

The publisher and each subscriber have databases of their own, as services do. The
fan-out tests run on every transport that carries events (memory, RabbitMQ, the
PostgreSQL broker); what needs bindings shared between processes, on the last two.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import ExitStack

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from saga import Outbox, Service
from saga.broker.transport import BrokerConfig
from saga.consumers import DeliveryOutcome, ServiceRunner
from saga.errors import EventsNotSupported
from saga.observability.metrics import Metrics
from saga.outbox_relay import Relay, RelayOptions
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import DatabaseFactory, TestDatabase
from tests.support.events import (
    REPAIRED_DDL,
    SUBSCRIBERS,
    Announce,
    Happened,
    Proclaim,
    Unheard,
    announcer,
    proclaimer,
    subscribers,
)
from tests.support.running import running_relay, running_service
from tests.support.services import EFFECTS_DDL, effects_per_key
from tests.support.wait import wait_until


@pytest.fixture
def subscriber_dbs(database_factory: DatabaseFactory) -> Iterator[dict[str, TestDatabase]]:
    """A database of its own for each subscriber, with its effects table."""
    made = {name: database_factory.create() for name in SUBSCRIBERS}
    for database in made.values():
        database.execute(EFFECTS_DDL)
        database.execute(REPAIRED_DDL)
    yield made
    for database in made.values():
        database_factory.drop(database.name)


def publish(db: TestDatabase, *keys: str) -> None:
    """Publish one :class:`Happened` per key, in one transaction of the publisher."""
    with db.connect(autocommit=False) as conn, conn.transaction():
        for key in keys:
            Outbox().publish(conn, Happened(key=key, amount=len(key)))


def handled(databases: dict[str, TestDatabase]) -> dict[str, dict[str, int]]:
    """Subscriber -> key -> how many times its effect was applied."""
    return {name: effects_per_key(db, name) for name, db in databases.items()}


def running_subscribers(
    stack: ExitStack, databases: dict[str, TestDatabase], broker: TestBroker, *names: str
) -> dict[str, ServiceRunner]:
    """Start the named subscribers (all by default), each on its own database."""
    return {
        name: stack.enter_context(running_service(subscribers[name], databases[name], broker))
        for name in names or SUBSCRIBERS
    }


def test_every_subscriber_handles_every_committed_event_once(
    db: TestDatabase, subscriber_dbs: dict[str, TestDatabase], event_broker: TestBroker
) -> None:
    keys = [f"e{i:02d}" for i in range(30)]
    publish(db, *keys)
    failing = pytest.raises(psycopg.errors.DivisionByZero)
    with failing, db.connect(autocommit=False) as conn, conn.transaction():
        Outbox().publish(conn, Happened(key="rolled-back"))
        conn.execute("SELECT 1/0")  # the transaction fails: its event never leaves
    with ExitStack() as stack:
        running_subscribers(stack, subscriber_dbs, event_broker)
        stack.enter_context(running_relay(db, event_broker))
        wait_until(
            lambda: all(len(h) == len(keys) for h in handled(subscriber_dbs).values()),
            what="every subscriber handled every event",
        )
    assert handled(subscriber_dbs) == {name: dict.fromkeys(keys, 1) for name in SUBSCRIBERS}
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0


def test_a_handler_publishes_in_its_own_transaction(
    db: TestDatabase, subscriber_dbs: dict[str, TestDatabase], event_broker: TestBroker
) -> None:
    db.execute(EFFECTS_DDL)
    with ExitStack() as stack:
        running_subscribers(stack, subscriber_dbs, event_broker, "notices")
        stack.enter_context(running_service(announcer, db, event_broker))
        with db.connect(autocommit=False) as conn, conn.transaction():
            Outbox().add(conn, Announce(key="k1"), destination=announcer.name)
        stack.enter_context(running_relay(db, event_broker))
        wait_until(lambda: effects_per_key(subscriber_dbs["notices"], "notices") == {"k1": 1})
    assert effects_per_key(db, "announcer") == {"k1": 1}


def test_publish_async_writes_the_same_event_row(db: TestDatabase) -> None:
    async def write() -> None:
        async with await psycopg.AsyncConnection.connect(db.url) as conn, conn.transaction():
            await Outbox().publish_async(conn, Happened(key="a1", amount=2))

    asyncio.run(write())
    rows = db.rows("SELECT destination, message_type FROM saga.outbox")
    assert rows == [(None, "Happened")]


def test_an_event_nobody_subscribes_to_is_counted_not_retried_nor_dead_lettered(
    db: TestDatabase, subscriber_dbs: dict[str, TestDatabase], shared_event_broker: TestBroker
) -> None:
    with db.connect(autocommit=False) as conn, conn.transaction():
        for i in range(3):
            Outbox().publish(conn, Unheard(key=f"u{i}"))
        Outbox().publish(conn, Happened(key="heard"))
    metrics = Metrics(CollectorRegistry())
    with ExitStack() as stack:
        running_subscribers(stack, subscriber_dbs, shared_event_broker, "ledger")
        relay = Relay(db.url, shared_event_broker.config, topology=shared_event_broker.topology,
                      metrics=metrics)  # fmt: skip
        with relay:
            assert relay.drain() == 4
        wait_until(lambda: effects_per_key(subscriber_dbs["ledger"], "ledger") == {"heard": 1})
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0
    assert db.scalar("SELECT count(*) FROM saga.dead_letters") == 0
    assert db.rows("SELECT message_type, events FROM saga.events_unrouted") == [("Unheard", 3)]
    assert metrics.events_unrouted.labels("Unheard")._value.get() == 3
    stats = saga_cli(db.url, "stats", "--json")
    assert '"Unheard"' in stats.stdout, stats.stdout + stats.stderr


def test_a_consumer_counts_its_unrouted_events_with_its_next_transaction(
    db: TestDatabase, shared_event_broker: TestBroker
) -> None:
    """A consumer that publishes its own rows counts the events nobody took with the
    transaction that deletes those rows (its next batch's, or when it stops or idles), not
    in a transaction of its own; the metric counts them at once."""
    db.execute(EFFECTS_DDL)
    metrics = Metrics(CollectorRegistry())
    unrouted = metrics.events_unrouted.labels("Unheard")

    def command(key: str) -> None:
        with db.connect(autocommit=False) as conn, conn.transaction():
            Outbox().add(conn, Proclaim(key=key), destination=proclaimer.name)

    def counted() -> list[tuple[object, ...]]:
        return db.rows("SELECT message_type, events FROM saga.events_unrouted")

    with ExitStack() as stack:  # 5 s before an idle worker settles on its own
        stack.enter_context(
            running_service(proclaimer, db, shared_event_broker, metrics, poll_timeout=5)
        )
        stack.enter_context(running_relay(db, shared_event_broker))
        command("p1")
        wait_until(lambda: unrouted._value.get() == 1, what="the first event published")
        assert counted() == []  # no transaction of its own
        command("p2")
        wait_until(lambda: unrouted._value.get() == 2, what="the second event published")
        assert counted() == [("Unheard", 1)]  # with the second command's transaction
    assert counted() == [("Unheard", 2)]  # the worker settled what it held as it stopped
    assert effects_per_key(db, "proclaimer") == {"p1": 1, "p2": 1}


def test_a_subscriber_added_later_gets_the_events_published_after_its_queue_was_declared(
    db: TestDatabase, subscriber_dbs: dict[str, TestDatabase], shared_event_broker: TestBroker
) -> None:
    broker = shared_event_broker
    with ExitStack() as stack:
        running_subscribers(stack, subscriber_dbs, broker, "billing")
        with Relay(db.url, broker.config, topology=broker.topology) as relay:
            publish(db, "before-1", "before-2")
            relay.drain()
            wait_until(lambda: len(effects_per_key(subscriber_dbs["billing"], "billing")) == 2)
            running_subscribers(stack, subscriber_dbs, broker, "ledger")  # added now
            publish(db, "after-1")
            relay.drain()
            wait_until(
                lambda: effects_per_key(subscriber_dbs["ledger"], "ledger") == {"after-1": 1}
            )
            wait_until(lambda: len(effects_per_key(subscriber_dbs["billing"], "billing")) == 3)
    assert effects_per_key(subscriber_dbs["ledger"], "ledger") == {"after-1": 1}
    assert db.scalar("SELECT events FROM saga.events_unrouted") is None  # billing had them all


def test_a_subscriber_that_was_down_gets_everything_published_meanwhile(
    db: TestDatabase, subscriber_dbs: dict[str, TestDatabase], shared_event_broker: TestBroker
) -> None:
    broker = shared_event_broker
    with ExitStack() as stack:
        running_subscribers(stack, subscriber_dbs, broker)  # every queue bound once
    keys = [f"d{i}" for i in range(25)]
    with ExitStack() as stack:
        running_subscribers(stack, subscriber_dbs, broker, "billing")  # the others are down
        stack.enter_context(running_relay(db, broker))
        publish(db, *keys)
        wait_until(lambda: len(effects_per_key(subscriber_dbs["billing"], "billing")) == 25)
        assert handled(subscriber_dbs)["notices"] == {}
        running_subscribers(stack, subscriber_dbs, broker, "notices", "ledger")  # back up
        wait_until(
            lambda: all(len(h) == 25 for h in handled(subscriber_dbs).values()),
            what="the subscribers that were down caught up",
        )
    assert handled(subscriber_dbs) == {name: dict.fromkeys(keys, 1) for name in SUBSCRIBERS}


def test_replaying_one_subscribers_dead_letter_redelivers_to_that_subscriber_only(
    db: TestDatabase, subscriber_dbs: dict[str, TestDatabase], shared_event_broker: TestBroker
) -> None:
    billing_db = subscriber_dbs["billing"]
    with ExitStack() as stack:
        runners = running_subscribers(stack, subscriber_dbs, shared_event_broker)
        stack.enter_context(running_relay(db, shared_event_broker))
        stack.enter_context(running_relay(billing_db, shared_event_broker))  # billing's own
        publish(db, "fine", "broken-1")
        wait_until(lambda: billing_db.scalar("SELECT count(*) FROM saga.dead_letters") == 1)
        wait_until(lambda: len(effects_per_key(subscriber_dbs["notices"], "notices")) == 2)
        letter = billing_db.scalar("SELECT id FROM saga.dead_letters")
        billing_db.execute("INSERT INTO public.repaired VALUES ('broken-1')")
        replayed = saga_cli(billing_db.url, "dlq", "replay", str(letter))
        assert replayed.returncode == 0, replayed.stderr
        wait_until(lambda: effects_per_key(billing_db, "billing") == {"fine": 1, "broken-1": 1})
        deliveries = {name: sum(runner.counts.values()) for name, runner in runners.items()}
    assert deliveries == {"billing": 3, "notices": 2, "ledger": 2}  # the replay went to billing
    assert runners["notices"].counts[DeliveryOutcome.DUPLICATE] == 0
    assert handled(subscriber_dbs)["ledger"] == {"fine": 1, "broken-1": 1}


def test_redis_refuses_events_loudly_a_subscriber_stops_and_the_relay_dead_letters_them(
    db: TestDatabase, redis_url: str, subscriber_dbs: dict[str, TestDatabase]
) -> None:
    broker = TestBroker(redis_url, "redis", accepts_message_loss=True)
    try:
        runner = ServiceRunner(subscribers["billing"], subscriber_dbs["billing"].url, broker.config,
                               topology=broker.topology)  # fmt: skip
        broker.use("billing")
        runner.start()
        try:
            ready = runner.wait_ready(30)
        finally:
            runner.stop(30)
        assert not ready
        assert isinstance(runner.failure, EventsNotSupported)
        assert "Redis for commands only" in str(runner.failure)
        publish(db, "r1")
        options = RelayOptions(max_publish_attempts=5)
        with Relay(db.url, broker.config, options, broker.topology) as relay:
            report = relay.relay_batch()
        assert (report.claimed, report.published, report.quarantined) == (1, 0, 1)  # at once
        letter = db.rows("SELECT reason, error_type, destination FROM saga.dead_letters")
        assert letter == [("unpublishable", "EventsNotSupported", None)]
        replayed = saga_cli(db.url, "dlq", "replay", "--error-type", "EventsNotSupported")
        assert replayed.returncode == 0, replayed.stderr
        again = db.rows("SELECT destination, message_type FROM saga.outbox")
        assert again == [(None, "Happened")]  # published again, to every subscriber
    finally:
        broker.cleanup()
    assert not BrokerConfig(redis_url).capabilities.events


def test_saga_subscriptions_lists_who_subscribes_to_what_per_service_and_broker(
    subscriber_dbs: dict[str, TestDatabase], shared_event_broker: TestBroker
) -> None:
    broker = shared_event_broker
    with ExitStack() as stack:
        running_subscribers(stack, subscriber_dbs, broker)
    urls = [arg for db in subscriber_dbs.values() for arg in ("--database-url", db.url)]
    listed = saga_cli(
        subscriber_dbs["billing"].url, "subscriptions", *urls, "--broker-url", broker.url, "--json"
    )
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    services = {(s["service"], s["event"], s["queue"]) for s in document["services"]}
    assert services == {(n, "Happened", broker.topology.queue_name(n)) for n in SUBSCRIBERS}
    exchange = broker.topology.events_exchange_name
    if broker.kind == "postgres":  # the broker's own routing table, too
        bindings = {
            (b["event"], b["queue"])
            for b in document["broker_bindings"]
            if b["exchange"] == exchange
        }
        assert bindings == {("Happened", broker.topology.queue_name(n)) for n in SUBSCRIBERS}
    else:
        assert "broker_bindings" not in document
    table = saga_cli(subscriber_dbs["billing"].url, "subscriptions")
    assert table.returncode == 0 and "billing" in table.stdout and "Happened" in table.stdout
    assert "notices" not in table.stdout  # that service's database was not named


def test_a_subscription_dropped_from_the_code_is_unbound_when_the_service_connects(
    db: TestDatabase, subscriber_dbs: dict[str, TestDatabase], shared_event_broker: TestBroker
) -> None:
    broker = shared_event_broker
    with ExitStack() as stack:
        running_subscribers(stack, subscriber_dbs, broker, "ledger")  # bound to Happened
    ledger_v2 = Service("ledger")  # the next version no longer subscribes to it
    ledger_v2.add_handler(Announce, lambda tx, command, ctx: None)
    with running_service(ledger_v2, subscriber_dbs["ledger"], broker) as runner:
        publish(db, "after-the-change")
        with Relay(db.url, broker.config, topology=broker.topology) as relay:
            assert relay.drain() == 1
        assert sum(runner.counts.values()) == 0
    assert db.rows("SELECT message_type, events FROM saga.events_unrouted") == [("Happened", 1)]
    assert subscriber_dbs["ledger"].scalar("SELECT count(*) FROM saga.subscriptions") == 0
