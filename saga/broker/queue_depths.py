"""How many messages wait in each destination's queue of RabbitMQ or Redis, as the
broker tells it to a passive declare (which creates nothing). The PostgreSQL broker
tells more (``saga.observability.broker_queues``)."""

from __future__ import annotations

from collections.abc import Iterable

from saga.broker.transport import BrokerConfig, Topology


def waiting_messages(
    config: BrokerConfig, topology: Topology, destinations: Iterable[str]
) -> dict[str, int]:
    """Destination -> messages ready in its queue; a queue the broker lacks is left out."""
    found: dict[str, int] = {}
    with config.connected() as conn:
        channel = conn.channel()
        for destination in destinations:
            try:
                declared = topology.queue(destination)(channel).queue_declare(passive=True)
            except conn.channel_errors:  # no such queue; AMQP closed the channel for it
                channel = conn.channel()
                continue
            found[destination] = int(declared.message_count)
    return found
