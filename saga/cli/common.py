"""Options and helpers shared by the ``saga`` subcommands."""

from __future__ import annotations

import signal
import threading
from datetime import datetime
from typing import Annotated, Any

import psycopg
import typer
from rich.console import Console
from rich.table import Table

from saga.broker.transport import (
    DEFAULT_DELIVERY_LIMIT,
    DEFAULT_HEARTBEAT,
    BrokerConfig,
    Topology,
)
from saga.cli.durations import parse_duration
from saga.errors import DatabaseUnavailable
from saga.observability.logs import configure_logging
from saga.observability.metrics import Metrics
from saga.observability.redaction import password_of, redact_text
from saga.settings import (
    ENV_ACCEPT_REDIS_MESSAGE_LOSS,
    ENV_BROKER_URL,
    ENV_DATABASE_URL,
    ENV_DELIVERY_LIMIT,
    ENV_QUEUE_TYPE,
    ENV_SCHEMA,
    Settings,
    load_settings,
)

console = Console()
err_console = Console(stderr=True)


def print_table(table: Table) -> None:
    """Print ``table`` whole: on a terminal, cells and headers too wide fold onto more
    lines (never cut to ``compe…``); piped or redirected, at its full width, whatever
    ``COLUMNS`` says."""
    for column in table.columns:
        column.overflow = "fold"
    if console.is_terminal:
        console.print(table)
        return
    whole = Console(width=10_000, color_system=None)
    whole.width = max(console.width, whole.measure(table).maximum)
    whole.print(table, crop=False)


def iso(value: datetime | None) -> str | None:
    """A timestamp as ISO 8601 text for ``--json`` output (None stays None)."""
    return value.isoformat() if value is not None else None


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


def settings_from(
    database_url: str | None = None,
    broker_url: str | None = None,
    schema: str | None = None,
    heartbeat: int | None = None,
    accept_redis_message_loss: bool = False,
    queue_type: str | None = None,
    delivery_limit: int | None = None,
) -> Settings:
    return load_settings(
        database_url=database_url,
        broker_url=broker_url,
        db_schema=schema,
        broker_heartbeat=str(heartbeat) if heartbeat is not None else None,
        accept_redis_message_loss="true" if accept_redis_message_loss else None,
        queue_type=queue_type,
        delivery_limit=str(delivery_limit) if delivery_limit is not None else None,
    )


def topology(settings: Settings, queue_prefix: str) -> Topology:
    """The queues of a relay or a consumer: ``queue_prefix`` and the settings' queue type."""
    return Topology(queue_prefix=queue_prefix, queue_type=settings.queue_type)


def connect(
    settings: Settings,
    url: str | None = None,
    *,
    what: str = "PostgreSQL",
    autocommit: bool = False,
) -> psycopg.Connection[Any]:
    """A connection to ``url`` (default: the settings' database) the way the settings say
    (directly or through a transaction pooler), with a clear error when it cannot be had."""
    url = url or settings.require_database_url()
    try:
        return settings.database_access().connect(url, autocommit=autocommit)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"cannot connect to {what}: {redact_text(str(exc), password_of(url))}"
        ) from None


def setup_logging(settings: Settings, level: str, fmt: str) -> None:
    if fmt not in ("text", "json"):
        raise typer.BadParameter("--log-format must be text or json")
    configure_logging(level, fmt, *settings.secrets())


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT, for a graceful stop."""
    stop = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        err_console.print(f"[yellow]{signal.Signals(signum).name}: stopping after the work in hand")
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return stop


MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        help="Serve Prometheus metrics on this port. Env: SAGA_METRICS_PORT.",
        envvar="SAGA_METRICS_PORT",
    ),
]


def serve_metrics(port: int | None, settings: Settings) -> Metrics | None:
    if port is None:
        return None
    metrics = Metrics()
    access = settings.database_access()
    metrics.watch_database(settings.require_database_url(), settings.db_schema, access)
    metrics.watch_vacuum(settings.require_database_url(), settings.db_schema, "service", access)
    broker = broker_config(settings) if settings.broker_url else None
    if broker is not None and broker.capabilities.queue_details:
        metrics.watch_broker(lambda: broker.queue_depths(access=access))
    if broker is not None and broker.database is not None:
        metrics.watch_vacuum(*broker.database, "broker", access)
    metrics.serve(port)
    return metrics


def broker_config(settings: Settings) -> BrokerConfig:
    return BrokerConfig(
        settings.require_broker_url(),
        heartbeat=settings.broker_heartbeat,
        accept_redis_message_loss=settings.accept_redis_message_loss,
        visibility_timeout=settings.redis_visibility_timeout,
        lease=settings.broker_lease,
        listen=settings.broker_listens(),
        pooled=settings.database_access().pooled,
    )


def seconds_of(text: str | None) -> float | None:
    duration = parse_duration(text)
    return duration.total_seconds() if duration is not None else None


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
