"""One contract, every transport: memory, RabbitMQ (amqp) and Redis.

Each test here runs once per transport through the ``any_broker`` fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from consumers import Outcome
from examples.order_saga.redis_server import RedisServer
from saga import Outbox
from saga.envelope import Envelope
from tests.support.brokers import TestBroker
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


def _hops_done(db: TestDatabase) -> int:
    return int(db.scalar("SELECT count(DISTINCT (key, seq)) FROM effects WHERE kind = 'hop'"))


def test_a_persistent_redis_restart_loses_nothing(
    db: TestDatabase, private_redis: Callable[..., RedisServer]
) -> None:
    """Crash Redis twice while chains flow: relay and consumer reconnect, nothing is lost."""
    db.execute(EFFECTS_DDL)
    server = private_redis(persistent=True)
    broker = TestBroker(server.url, "redis")
    chains, hops = 20, 60
    with db.connect(autocommit=False) as conn, conn.transaction():
        for chain in range(chains):
            Outbox().add(conn, Hop(chain=f"c{chain}", seq=1, last=hops), destination=service.name)
    with running_service(service, db, broker) as runner, running_relay(db, broker):
        for threshold in (chains * hops // 4, chains * hops // 2):
            wait_until(lambda t=threshold: _hops_done(db) >= t, what=f"{threshold} hops")
            server.restart()
        wait_until(lambda: _hops_done(db) == chains * hops, timeout=90, what="every hop")
        assert runner.failure is None
    assert db.scalar("SELECT count(*) FROM effects WHERE kind = 'hop'") == chains * hops
