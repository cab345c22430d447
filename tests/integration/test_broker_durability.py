"""A Redis broker that loses messages on restart is refused unless the risk is accepted.

Each test runs its own ``redis-server`` (never the shared one) with the settings it needs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from saga import Outbox
from saga.errors import UnsafeDurability
from saga.outbox_relay import Relay
from tests.rig.redis_server import RedisServer
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.running import ThreadDied, running_relay, running_service
from tests.support.services import EFFECTS_DDL, Ping, service
from tests.support.wait import wait_until

START = Callable[..., RedisServer]


def _relay_connects(db: TestDatabase, broker: TestBroker) -> None:
    with Relay(db.url, broker.config, topology=broker.topology) as relay:
        assert relay.drain() == 0


@pytest.mark.parametrize(
    ("extra", "named"),
    [((), "appendonly 'no'"), (("--appendonly", "yes", "--appendfsync", "everysec"), "everysec")],
)
def test_relay_and_consumer_refuse_a_redis_that_loses_messages(
    db: TestDatabase, private_redis: START, extra: tuple[str, ...], named: str
) -> None:
    broker = TestBroker(private_redis(persistent=False, extra_args=extra).url, "redis")
    with pytest.raises(UnsafeDurability, match=named):
        _relay_connects(db, broker)
    with (
        pytest.raises(ThreadDied, match="died: UnsafeDurability"),
        running_service(service, db, broker),
    ):
        pass
    accepted = TestBroker(broker.url, "redis", broker.topology, accepts_message_loss=True)
    _relay_connects(db, accepted)
    with running_service(service, db, accepted) as runner:
        assert runner.failure is None


def test_a_persistent_redis_is_used_and_one_without_config_is_tolerated(
    db: TestDatabase, private_redis: START, caplog: pytest.LogCaptureFixture
) -> None:
    _relay_connects(db, TestBroker(private_redis(persistent=True).url, "redis"))
    assert "persistence settings" not in caplog.text
    locked = private_redis(persistent=False, extra_args=("--rename-command", "CONFIG", ""))
    broker = TestBroker(locked.url, "redis")
    db.execute(EFFECTS_DDL)
    with running_service(service, db, broker), running_relay(db, broker):
        with db.connect(autocommit=False) as conn, conn.transaction():
            Outbox().add(conn, Ping(key="through"), destination=service.name)
        wait_until(lambda: db.scalar("SELECT count(*) FROM effects") == 1, what="the ping")
    assert "cannot read the Redis broker's persistence settings" in caplog.text


def test_saga_relay_refuses_a_redis_without_persistence_with_a_clear_message(
    db: TestDatabase, private_redis: START
) -> None:
    url = private_redis(persistent=False).url
    refused = saga_cli(db.url, "relay", "--broker-url", url)
    assert refused.returncode == 2, refused.stderr
    assert "appendonly 'no'" in refused.stderr and "--accept-redis-message-loss" in refused.stderr
