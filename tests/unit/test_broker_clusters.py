"""A RabbitMQ cluster's settings: broker URLs listing several nodes, quorum queues, the
delivery count that quorum queues put on a redelivery."""

from __future__ import annotations

import pytest

from saga.broker.amqp import AMQP
from saga.broker.transport import BrokerConfig, Topology, delivery_count
from saga.errors import ConfigurationError
from saga.observability.redaction import passwords_of, redact_url
from saga.settings import load_settings

SECRETS = ("n0de-One-Pa55", "n0de-Two-Pa55")
NODES = f"amqp://app:{SECRETS[0]}@mq1:5672//;amqp://app:{SECRETS[1]}@mq2:5673//"


def test_every_node_of_a_failover_list_is_redacted() -> None:
    assert redact_url(NODES) == "amqp://app:***@mq1:5672//;amqp://app:***@mq2:5673//"
    assert repr(BrokerConfig(NODES)) == (
        "BrokerConfig(url='amqp://app:***@mq1:5672//;amqp://app:***@mq2:5673//')"
    )
    assert passwords_of(NODES) == list(SECRETS)
    assert set(SECRETS) <= set(load_settings(broker_url=NODES).secrets())


def test_a_semicolon_inside_one_url_is_not_a_list() -> None:
    url = f"postgresql://app:{SECRETS[0]};x@db/orders"
    assert redact_url(url) == "postgresql://app:***@db/orders"
    assert passwords_of(url) == [f"{SECRETS[0]};x"]


def test_a_failover_list_names_its_nodes_in_order() -> None:
    config = BrokerConfig(NODES)
    assert config.urls == tuple(NODES.split(";"))
    assert config.kind is AMQP
    assert [config.connect(node).port for node in range(2)] == [5672, 5673]


@pytest.mark.parametrize(
    ("url", "refusal"),
    [
        (f"{NODES};", "empty entry"),
        (f"{NODES};redis://mq3:6379/0", "different brokers"),
        (f"{NODES};kafka://app:{SECRETS[0]}@mq3", "not supported"),
    ],
)
def test_a_bad_node_in_the_list_is_refused_with_the_reason(url: str, refusal: str) -> None:
    with pytest.raises(ConfigurationError, match=refusal) as info:
        BrokerConfig(url)
    assert not any(secret in str(info.value) for secret in SECRETS)


def test_quorum_queues_are_declared_durable_with_their_type() -> None:
    queue = Topology(queue_type="quorum").queue("billing")
    assert (queue.name, queue.durable, queue.auto_delete) == ("saga.billing", True, False)
    assert queue.queue_arguments == {"x-queue-type": "quorum"}
    assert Topology().queue("billing").queue_arguments is None  # classic: the broker's default


def test_queue_type_and_delivery_limit_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SAGA_QUEUE_TYPE", "quorum")
    monkeypatch.setenv("SAGA_DELIVERY_LIMIT", "7")
    settings = load_settings()
    assert (settings.queue_type, settings.delivery_limit) == ("quorum", 7)
    monkeypatch.setenv("SAGA_QUEUE_TYPE", "stream")
    with pytest.raises(ConfigurationError, match="queue_type"):
        load_settings()
    with pytest.raises(ConfigurationError, match="not one of classic, quorum"):
        Topology(queue_type="stream")


@pytest.mark.parametrize(
    ("headers", "count"),
    [(None, 0), ({}, 0), ({"x-delivery-count": 4}, 4), ({"x-delivery-count": "4"}, 0)],
)
def test_delivery_count_reads_the_quorum_queue_header(headers: object, count: int) -> None:
    assert delivery_count(headers) == count  # type: ignore[arg-type]
