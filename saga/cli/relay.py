"""``saga relay``: forwards outbox rows to the broker."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from saga.cli.durations import seconds_of
from saga.cli.options import (
    AcceptRedisMessageLossOption,
    BrokerUrlOption,
    DatabaseUrlOption,
    HeartbeatOption,
    LogFormatOption,
    LogLevelOption,
    MetricsPortOption,
    QueuePrefixOption,
    QueueTypeOption,
    SchemaOption,
)
from saga.cli.output import err_console
from saga.cli.runtime import (
    broker_config,
    serve_metrics,
    settings_from,
    setup_logging,
    stop_on_signals,
    topology,
)
from saga.cli.text import foreign
from saga.messaging.leases import DEFAULT_LEASE
from saga.observability.metrics import Metrics
from saga.settings import Settings

if TYPE_CHECKING:  # loaded when a relay is built, not for every command of the CLI
    from saga.outbox_relay.relay import Relay, RelayOptions


def relay(
    database_url: DatabaseUrlOption = None,
    broker_url: BrokerUrlOption = None,
    schema: SchemaOption = None,
    queue_prefix: QueuePrefixOption = "saga.",
    queue_type: QueueTypeOption = None,
    batch_size: Annotated[int, typer.Option(help="Rows leased and published per batch.")] = 500,
    lease: Annotated[
        float,
        typer.Option(
            help="Seconds the rows of a batch stay leased to this relay while it publishes "
            "them; another relay takes them only once the lease has lapsed (this one died). "
            "Env: SAGA_RELAY_LEASE.",
            envvar="SAGA_RELAY_LEASE",
            min=0.001,
        ),
    ] = DEFAULT_LEASE.total_seconds(),
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
    from saga.outbox_relay.relay import RelayOptions

    settings = settings_from(
        database_url, broker_url, schema, heartbeat, accept_redis_message_loss, queue_type
    )
    setup_logging(settings, log_level, log_format)
    worker = build_relay(
        settings,
        queue_prefix,
        serve_metrics(metrics_port, settings),
        RelayOptions(
            batch_size=batch_size,
            lease=timedelta(seconds=lease),
            max_publish_attempts=max_attempts,
            declare_queues=declare_queues,
            allow_async_commit=allow_async_commit,
            prune_interval=seconds_of(prune_interval),
        ),
    )
    stop = stop_on_signals()
    err_console.print(foreign(f"relay started: {worker!r}"), soft_wrap=True)
    worker.run(stop)


def build_relay(
    settings: Settings,
    queue_prefix: str,
    metrics: Metrics | None,
    tuning: RelayOptions | None = None,
) -> Relay:
    """A relay for the database and broker of ``settings``: ``tuning``'s knobs (the
    defaults when None) with the schema, signing keys and database access of ``settings``.
    ``saga relay`` runs one as its process; ``saga consume --relay`` beside its workers."""
    from saga.outbox_relay.relay import Relay, RelayOptions

    options = replace(
        tuning or RelayOptions(),
        schema=settings.db_schema,
        signing=settings.key_ring(),
        database=settings.database_access(),
    )
    return Relay(
        settings.require_database_url(),
        broker_config(settings),
        options,
        topology(settings, queue_prefix),
        metrics=metrics,
    )
