"""The options the ``saga`` subcommands share, as annotated types for Typer."""

from __future__ import annotations

from typing import Annotated

import typer

from saga.broker.transport import DEFAULT_DELIVERY_LIMIT, DEFAULT_HEARTBEAT
from saga.settings import (
    ENV_ACCEPT_REDIS_MESSAGE_LOSS,
    ENV_BROKER_URL,
    ENV_DATABASE_URL,
    ENV_DELIVERY_LIMIT,
    ENV_QUEUE_TYPE,
    ENV_SCHEMA,
)

DatabaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help=f"PostgreSQL URL, e.g. postgresql://user@host/db. Env: {ENV_DATABASE_URL}.",
        show_default=False,
    ),
]
BrokerUrlOption = Annotated[
    str | None,
    typer.Option(
        "--broker-url",
        help="Broker URL: amqp://, redis://, postgresql:// or memory://; a cluster's nodes "
        f"separated by ';' (tried in turn). Env: {ENV_BROKER_URL}.",
        show_default=False,
    ),
]
QueueTypeOption = Annotated[
    str | None,
    typer.Option(
        "--queue-type",
        help="RabbitMQ: classic (default) or quorum, the type the destinations' queues are "
        f"declared with (quorum for a cluster; docs/scaling.md). Env: {ENV_QUEUE_TYPE}.",
        show_default=False,
    ),
]
SchemaOption = Annotated[
    str | None,
    typer.Option(
        "--schema",
        help=f"PostgreSQL schema of the framework's tables (default saga). Env: {ENV_SCHEMA}.",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
QueuePrefixOption = Annotated[
    str,
    typer.Option(
        "--queue-prefix",
        help="Prefix of every queue name. Env: SAGA_QUEUE_PREFIX.",
        envvar="SAGA_QUEUE_PREFIX",
    ),
]
HeartbeatOption = Annotated[
    int | None,
    typer.Option(
        "--heartbeat",
        help=f"AMQP heartbeat in seconds (default {DEFAULT_HEARTBEAT}). "
        "Env: SAGA_BROKER_HEARTBEAT.",
        show_default=False,
    ),
]
AcceptRedisMessageLossOption = Annotated[
    bool,
    typer.Option(
        "--accept-redis-message-loss",
        help="Run on a Redis broker that loses messages when it restarts (appendonly no, or "
        "appendfsync not always): sagas whose messages it drops wait until `saga resume`. "
        f"Refused by default. Env: {ENV_ACCEPT_REDIS_MESSAGE_LOSS}.",
        show_default=False,
    ),
]
LogLevelOption = Annotated[
    str,
    typer.Option(
        "--log-level",
        help="DEBUG, INFO, WARNING or ERROR. Env: SAGA_LOG_LEVEL.",
        envvar="SAGA_LOG_LEVEL",
    ),
]
LogFormatOption = Annotated[
    str,
    typer.Option(
        "--log-format", help="text or json. Env: SAGA_LOG_FORMAT.", envvar="SAGA_LOG_FORMAT"
    ),
]
DeliveryLimitOption = Annotated[
    int | None,
    typer.Option(
        "--delivery-limit",
        help="Quorum queues: a message delivered this many times without being acknowledged "
        "(its consumer died on it every time) becomes a dead letter (default "
        f"{DEFAULT_DELIVERY_LIMIT}). Env: {ENV_DELIVERY_LIMIT}.",
        show_default=False,
    ),
]
MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        help="Serve Prometheus metrics on this port. Env: SAGA_METRICS_PORT.",
        envvar="SAGA_METRICS_PORT",
    ),
]
StuckAfterOption = Annotated[
    str, typer.Option(help="A running saga with no progress for this long is stuck.")
]
RegistryOption = Annotated[
    str,
    typer.Option(
        "--registry",
        help="The saga registry, as module:object (its definitions). Env: SAGA_REGISTRY.",
        envvar="SAGA_REGISTRY",
    ),
]
