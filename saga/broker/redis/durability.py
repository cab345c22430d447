"""Refusing a broker that forgets: Redis without persistence loses what it was given.

The relay deletes an outbox row once the broker has taken its message; a Redis
that keeps its lists only in memory (``appendonly no``, or an append-only file
written without ``appendfsync always``) drops those messages when it restarts,
and the sagas waiting on them wait forever. The relay and the consumers check
the server's settings on every connect and refuse such a broker unless the
operator accepted that risk explicitly (``accept_redis_message_loss``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kombu import Connection

from saga.errors import UnsafeDurability

if TYPE_CHECKING:
    from saga.broker.transport import BrokerConfig

logger = logging.getLogger(__name__)

#: The settings the framework needs from a Redis broker, and why.
REQUIRED_REDIS_SETTINGS = {
    "appendonly": ("yes", "without the append-only file Redis keeps messages only in memory"),
    "appendfsync": ("always", "anything else acknowledges writes before they are on disk"),
}
ACCEPT_OPTION = "--accept-redis-message-loss (SAGA_ACCEPT_REDIS_MESSAGE_LOSS=true)"


def redis_durability_problem(settings: Mapping[str, str]) -> str | None:
    """Why a Redis with these ``CONFIG GET`` settings can lose acknowledged messages, if it can."""
    for name, (needed, why) in REQUIRED_REDIS_SETTINGS.items():
        actual = settings.get(name, "")
        if actual != needed:
            return f"the Redis broker runs with {name} {actual or 'unset'!r} ({why})"
    return None


def check_broker_durability(broker: BrokerConfig, connection: Connection) -> None:
    """Raise :class:`UnsafeDurability` when ``connection``'s broker may lose messages on restart.

    ``connection`` is to a Redis (RabbitMQ's durable queues and persistent messages
    survive a restart, as the PostgreSQL broker's rows do). A server where ``CONFIG`` is disabled
    or not permitted cannot be checked: that is logged, and the broker is used.
    """
    # Imported here: the redis client library costs every process a fifth of a second at
    # start, and only a process on a Redis broker gets this far.
    import redis.exceptions

    client = connection.default_channel.client
    try:
        settings = {
            _text(key): _text(value)
            for name in REQUIRED_REDIS_SETTINGS
            for key, value in client.config_get(name).items()
        }
    except redis.exceptions.ResponseError as exc:  # CONFIG renamed, disabled or denied by ACL
        logger.warning(
            "cannot read the Redis broker's persistence settings (%s); make sure it runs with "
            "appendonly yes and appendfsync always, or it loses messages when it restarts",
            exc,
        )
        return
    problem = redis_durability_problem(settings)
    if problem is None:
        return
    if broker.accept_redis_message_loss:
        logger.warning(
            "%s: messages it holds are lost if it restarts (accepted by %s; recover stranded "
            "sagas with saga resume --stuck-after)",
            problem,
            ACCEPT_OPTION,
        )
        return
    raise UnsafeDurability(
        f"{problem}: a restart loses every message the relay already took from the outbox, "
        "and the sagas waiting for them never finish. Run Redis with appendonly yes and "
        f"appendfsync always, or pass {ACCEPT_OPTION} if you accept that risk."
    )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
