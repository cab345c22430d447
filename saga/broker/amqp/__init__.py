"""RabbitMQ (``amqp://``, ``amqps://``, ``pyamqp://``): multiple acks, heartbeats, a
publish batch in one AMQP transaction, ``mandatory`` publishes handed back when no queue
takes them, events through an exchange whose bindings RabbitMQ keeps with the queues."""

from __future__ import annotations

from saga.broker.capabilities import Capabilities
from saga.broker.kind import BrokerKind

#: py-amqp with read-ahead and gathered writes (:mod:`saga.broker.amqp.transport`).
READ_AHEAD_TRANSPORT = "saga.broker.amqp.transport:Transport"


class AmqpBroker(BrokerKind):
    name = "RabbitMQ"
    schemes = ("amqp", "amqps", "pyamqp")
    driver_type = "amqp"
    capabilities = Capabilities(
        multiple_ack=True,
        heartbeats=True,
        confirmed_publish=True,
        returns_unroutable=True,
        returns_unrouted_events=True,
        events=True,
        queue_details=False,
        delayed_delivery=False,
        routing_table=False,
    )

    def transport(self, scheme: str) -> str | None:
        """The read-ahead transport on plain TCP; ``amqps://`` keeps py-amqp's SSL one."""
        return None if scheme == "amqps" else READ_AHEAD_TRANSPORT


AMQP = AmqpBroker()
