"""What a ``saga`` subcommand needs to run: its settings, a database connection, the
broker's configuration and topology, logging, a graceful stop on signals, metrics."""

from __future__ import annotations

import signal
import threading
from typing import Any

import psycopg
import typer

from saga.broker.transport import BrokerConfig, Topology
from saga.cli.output import err_console
from saga.errors import DatabaseUnavailable
from saga.observability.logs import configure_logging
from saga.observability.metrics import Metrics
from saga.observability.redaction import password_of, redact_text
from saga.settings import Settings, load_settings


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
