"""``saga consume``: runs a service's (or a saga registry's) consumers."""

from __future__ import annotations

from typing import Annotated

import typer

from saga.cli.options import (
    AcceptRedisMessageLossOption,
    BrokerUrlOption,
    DatabaseUrlOption,
    DeliveryLimitOption,
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
from saga.handlers.service import DEFAULT_REPLY_LINGER
from saga.messaging.leases import DEFAULT_LEASE


def consume(
    target: Annotated[str, typer.Argument(help="The service to run, as module:object.")],
    database_url: DatabaseUrlOption = None,
    broker_url: BrokerUrlOption = None,
    schema: SchemaOption = None,
    queue_prefix: QueuePrefixOption = "saga.",
    queue_type: QueueTypeOption = None,
    delivery_limit: DeliveryLimitOption = None,
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
    publish_lease: Annotated[
        float,
        typer.Option(
            help="Seconds the messages a batch wrote stay leased to this consumer, to publish "
            "after its commit; a relay takes them only once the lease has lapsed (the "
            "consumer died, or its publish failed). Env: SAGA_PUBLISH_LEASE.",
            envvar="SAGA_PUBLISH_LEASE",
            min=0.001,
        ),
    ] = DEFAULT_LEASE.total_seconds(),
    reply_linger_ms: Annotated[
        float,
        typer.Option(
            "--reply-linger-ms",
            help="Milliseconds a reply that arrives alone waits for its siblings' replies "
            "(sent with it: a parallel group's, a fan-out's first items), to handle them in "
            "one transaction; 0: never waits. "
            "Env: SAGA_REPLY_LINGER_MS.",
            envvar="SAGA_REPLY_LINGER_MS",
            min=0.0,
        ),
    ] = DEFAULT_REPLY_LINGER.total_seconds() * 1000,
    resume_stuck_after: Annotated[
        str | None,
        typer.Option(
            "--resume-stuck-after",
            help="A saga home's consumer resumes its sagas with no progress for this long "
            "(e.g. 10m), as saga resume --stuck-after would: a command or reply a broker "
            "lost is sent again under its message id. Default: only an operator resumes. "
            "Env: SAGA_RESUME_STUCK_AFTER.",
            envvar="SAGA_RESUME_STUCK_AFTER",
            show_default=False,
        ),
    ] = None,
    with_relay: Annotated[
        bool,
        typer.Option(
            "--relay/--no-relay",
            help="Also run a relay in this process (a thread, as `saga relay` runs with its "
            "defaults): one process per service instead of two. Run `saga relay` apart to "
            "tune it or to scale it on its own.",
        ),
    ] = False,
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
    from saga.cli.durations import parse_duration
    from saga.cli.loading import load_service
    from saga.cli.relay import build_relay
    from saga.consumers.runner import ServiceRunner
    from saga.consumers.worker import ConsumerOptions
    from saga.observability.redaction import redact_url
    from saga.outbox_relay.background import BackgroundRelay

    settings = settings_from(
        database_url,
        broker_url,
        schema,
        heartbeat,
        accept_redis_message_loss,
        queue_type,
        delivery_limit,
    )
    setup_logging(settings, log_level, log_format)
    stuck_after = parse_duration(resume_stuck_after)
    if stuck_after is not None and stuck_after.total_seconds() <= 0:
        raise typer.BadParameter(
            f"{resume_stuck_after!r} is not a positive duration", param_hint="--resume-stuck-after"
        )
    service = load_service(target)
    database_url, broker = settings.require_database_url(), broker_config(settings)
    metrics = serve_metrics(metrics_port, settings)
    stop = stop_on_signals()
    runner = ServiceRunner(
        service,
        database_url,
        broker,
        ConsumerOptions(
            schema=settings.db_schema,
            concurrency=concurrency,
            prefetch=prefetch,
            signing=settings.key_ring(),
            side_effect_lease=settings.side_effect_lease,
            publish_after_commit=publish_after_commit,
            publish_lease=publish_lease,
            reply_linger=reply_linger_ms / 1000,
            delivery_limit=settings.delivery_limit,
            database=settings.database_access(),
            resume_stuck_after=stuck_after,
        ),
        topology(settings, queue_prefix),
        metrics=metrics,
        stop_event=stop,
    )
    relay = (
        BackgroundRelay(build_relay(settings, queue_prefix, metrics), stop) if with_relay else None
    )
    err_console.print(
        foreign(
            f"consuming {service!r} with {concurrency} worker(s)"
            f"{' and a relay' if relay else ''}: "
            f"database {redact_url(database_url)!r}, {broker!r}"
        ),
        soft_wrap=True,
    )
    try:
        runner.run()
    finally:
        stop.set()
        if relay is not None:
            relay.join()
    if relay is not None and relay.failure is not None:
        raise relay.failure
