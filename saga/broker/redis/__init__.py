"""Redis (``redis://``, ``rediss://``): commands only, no events (kombu keeps bindings in
keys a restart can wipe and drops a publish that finds none); a delivery a dead consumer
held comes back after the visibility timeout; a Redis that forgets is refused on
connect (:mod:`saga.broker.redis.durability`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kombu import Connection

from saga.broker.capabilities import Capabilities
from saga.broker.kind import BrokerKind
from saga.broker.redis.durability import check_broker_durability

if TYPE_CHECKING:
    from saga.broker.transport import BrokerConfig

#: kombu's Redis transport, made to keep a delivery through a Redis restart.
RESTART_SAFE_TRANSPORT = "saga.broker.redis.transport:Transport"


class RedisBroker(BrokerKind):
    name = "Redis"
    schemes = ("redis", "rediss")
    driver_type = "redis"
    polls = True
    capabilities = Capabilities(
        multiple_ack=False,
        heartbeats=False,
        confirmed_publish=False,
        returns_unroutable=False,
        returns_unrouted_events=False,
        events=False,
        queue_details=False,
        delayed_delivery=False,
        routing_table=False,
    )

    def transport(self, scheme: str) -> str | None:
        return RESTART_SAFE_TRANSPORT

    def transport_options(self, config: BrokerConfig) -> dict[str, Any]:
        return {
            "visibility_timeout": config.visibility_timeout,
            # The lock around a sweep that brings back a dead consumer's messages: a
            # process killed, or a persistent Redis crashed, while one holds it keeps it
            # (kombu: 300 s). Never longer than the visibility timeout itself.
            "unacked_mutex_expire": config.visibility_timeout,
        }

    def check_connected(self, config: BrokerConfig, connection: Connection) -> None:
        check_broker_durability(config, connection)


REDIS = RedisBroker()
