"""A broker URL picks one kind of broker, and a kombu connection finds its own again."""

from __future__ import annotations

import pytest
from kombu import Connection

from saga.broker.amqp import AMQP
from saga.broker.kinds import KINDS, SUPPORTED_SCHEMES, kind_of, kind_of_scheme
from saga.broker.memory import MEMORY
from saga.broker.postgres import POSTGRES
from saga.broker.redis import REDIS
from saga.broker.transport import BrokerConfig
from saga.errors import ConfigurationError

URLS = {
    "amqp://guest:guest@localhost:5672//": AMQP,
    "amqps://guest:guest@localhost:5671//": AMQP,
    "redis://localhost:6379/0": REDIS,
    "postgresql://app@localhost/broker": POSTGRES,
    "postgres://app@localhost/broker": POSTGRES,
    "memory://": MEMORY,
}


def test_every_scheme_belongs_to_one_kind() -> None:
    assert len(SUPPORTED_SCHEMES) == len(set(SUPPORTED_SCHEMES))
    assert {kind_of_scheme(scheme) for scheme in SUPPORTED_SCHEMES} == set(KINDS)


@pytest.mark.parametrize("url", sorted(URLS))
def test_a_url_and_its_connection_name_the_same_kind(url: str) -> None:
    config = BrokerConfig(url)
    assert config.kind is URLS[url]
    assert config.capabilities is URLS[url].capabilities
    assert kind_of(config.connect()) is URLS[url]


def test_only_a_broker_with_heartbeats_gets_them() -> None:
    for url, kind in URLS.items():
        connection = BrokerConfig(url, heartbeat=7).connect()
        assert connection.heartbeat == (7 if kind.capabilities.heartbeats else 0), url


def test_a_kombu_transport_the_framework_does_not_run_on_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="'filesystem' is not one the framework runs on"):
        kind_of(Connection("filesystem://"))
