"""``saga relay`` and ``saga consume``: the long-running services."""

from __future__ import annotations

from typing import Annotated

import typer

from saga.broker.transport import BrokerConfig, Topology
from saga.cli.common import (
    AcceptRedisMessageLossOption,
    BrokerUrlOption,
    DatabaseUrlOption,
    HeartbeatOption,
    LogFormatOption,
    LogLevelOption,
    QueuePrefixOption,
    SchemaOption,
    err_console,
    settings_from,
    setup_logging,
    stop_on_signals,
)
from saga.cli.durations import parse_duration
from saga.observability.metrics import Metrics
from saga.settings import Settings

MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        help="Serve Prometheus metrics on this port. Env: SAGA_METRICS_PORT.",
        envvar="SAGA_METRICS_PORT",
    ),
]


def _metrics(port: int | None, settings: Settings) -> Metrics | None:
    if port is None:
        return None
    metrics = Metrics()
    metrics.watch_database(settings.require_database_url(), settings.db_schema)
    metrics.serve(port)
    return metrics


def _broker(settings: Settings) -> BrokerConfig:
    return BrokerConfig(
        settings.require_broker_url(),
        heartbeat=settings.broker_heartbeat,
        accept_redis_message_loss=settings.accept_redis_message_loss,
        visibility_timeout=settings.redis_visibility_timeout,
    )


def _seconds(text: str | None) -> float | None:
    duration = parse_duration(text)
    return duration.total_seconds() if duration is not None else None


def relay(
    database_url: DatabaseUrlOption = None,
    broker_url: BrokerUrlOption = None,
    schema: SchemaOption = None,
    queue_prefix: QueuePrefixOption = "saga.",
    batch_size: Annotated[int, typer.Option(help="Rows claimed and published per batch.")] = 500,
    max_attempts: Annotated[
        int, typer.Option(help="Failed publishes of one row before it is quarantined.")
    ] = 5,
    declare_queues: Annotated[
        bool, typer.Option(help="Declare each destination's queue (off for locked-down brokers).")
    ] = True,
    allow_async_commit: Annotated[
        bool, typer.Option(help="Run even if synchronous_commit is off (risks lost messages).")
    ] = False,
    prune_interval: Annotated[
        str | None,
        typer.Option(
            help="Also prune past-retention rows this often (e.g. 1h; default retention)."
        ),
    ] = None,
    metrics_port: MetricsPortOption = None,
    heartbeat: HeartbeatOption = None,
    accept_redis_message_loss: AcceptRedisMessageLossOption = False,
    log_level: LogLevelOption = "INFO",
    log_format: LogFormatOption = "text",
) -> None:
    """Publish committed outbox rows to the broker until SIGTERM (run any number of these)."""
    from outbox_relay.relay import Relay, RelayOptions

    settings = settings_from(database_url, broker_url, schema, heartbeat, accept_redis_message_loss)
    setup_logging(settings, log_level, log_format)
    options = RelayOptions(
        schema=settings.db_schema,
        batch_size=batch_size,
        max_publish_attempts=max_attempts,
        declare_queues=declare_queues,
        allow_async_commit=allow_async_commit,
        prune_interval=_seconds(prune_interval),
        signing=settings.key_ring(),
    )
    worker = Relay(
        settings.require_database_url(),
        _broker(settings),
        options,
        Topology(queue_prefix=queue_prefix),
        metrics=_metrics(metrics_port, settings),
    )
    stop = stop_on_signals()
    err_console.print(f"relay started: {worker!r}")
    worker.run(stop)


def consume(
    target: Annotated[str, typer.Argument(help="The service to run, as module:object.")],
    database_url: DatabaseUrlOption = None,
    broker_url: BrokerUrlOption = None,
    schema: SchemaOption = None,
    queue_prefix: QueuePrefixOption = "saga.",
    concurrency: Annotated[
        int, typer.Option(help="Worker threads, each with its own connections.")
    ] = 1,
    prefetch: Annotated[
        int, typer.Option(help="Deliveries taken at once; also the largest batch per transaction.")
    ] = 100,
    publish_after_commit: Annotated[
        bool,
        typer.Option(
            help="Publish the messages a batch wrote right after it commits (the relay is the "
            "safety net); off: the relays publish everything."
        ),
    ] = True,
    metrics_port: MetricsPortOption = None,
    heartbeat: HeartbeatOption = None,
    accept_redis_message_loss: AcceptRedisMessageLossOption = False,
    log_level: LogLevelOption = "INFO",
    log_format: LogFormatOption = "text",
) -> None:
    """Run a service's handlers until SIGTERM.

    With SAGA_SIGNING_KEYS set, signatures are verified before decoding;
    SAGA_REQUIRE_SIGNATURE=true rejects unsigned messages too.
    """
    from consumers.runner import ServiceRunner
    from consumers.worker import ConsumerOptions
    from saga.cli.loading import load_service

    settings = settings_from(database_url, broker_url, schema, heartbeat, accept_redis_message_loss)
    setup_logging(settings, log_level, log_format)
    service = load_service(target)
    runner = ServiceRunner(
        service,
        settings.require_database_url(),
        _broker(settings),
        ConsumerOptions(
            schema=settings.db_schema,
            concurrency=concurrency,
            prefetch=prefetch,
            signing=settings.key_ring(),
            side_effect_lease=settings.side_effect_lease,
            publish_after_commit=publish_after_commit,
        ),
        Topology(queue_prefix=queue_prefix),
        metrics=_metrics(metrics_port, settings),
        stop_event=stop_on_signals(),
    )
    err_console.print(f"consuming {service!r} with {concurrency} worker(s)")
    runner.run()
