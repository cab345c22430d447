"""``saga stats``: counts, durations, oldest running and stuck sagas, events published that
no service subscribes to; with a broker that tells its queues by state (``queue_details``:
the PostgreSQL broker), the depth of its queues and the age of their oldest message."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from saga.broker.queue_depths import QueueDepth
from saga.cli.durations import parse_duration
from saga.cli.options import (
    BrokerUrlOption,
    DatabaseUrlOption,
    JsonOption,
    SchemaOption,
    StuckAfterOption,
)
from saga.cli.output import console, print_table
from saga.cli.runtime import broker_config, connect, settings_from
from saga.cli.sagas import step_text
from saga.cli.text import foreign
from saga.db.vacuum_horizon import VacuumHorizon, read_vacuum_horizon
from saga.engine.state import SagaStatus
from saga.messaging.events import UnroutedEvents
from saga.operations.stats import collect
from saga.settings import Settings


def _broker_queues(settings: Settings) -> dict[str, QueueDepth] | None:
    """Every queue of a broker whose capabilities have ``queue_details``; None for any
    other broker (or none set)."""
    broker = broker_config(settings) if settings.broker_url else None
    if broker is None or not broker.capabilities.queue_details:
        return None
    return broker.queue_depths(access=settings.database_access())


def _vacuum_horizons(settings: Settings) -> dict[str, VacuumHorizon]:
    """The service database's vacuum horizon, and the broker's when it keeps its messages
    in PostgreSQL."""
    places = {"database": (settings.require_database_url(), settings.db_schema)}
    broker = broker_config(settings) if settings.broker_url else None
    if broker is not None and broker.database is not None:
        places["broker"] = broker.database
    horizons = {}
    for place, (url, schema) in places.items():
        with connect(settings, url, what=f"the {place}", autocommit=True) as conn:
            horizons[place] = read_vacuum_horizon(conn, [schema])
    return horizons


def stats(
    window: Annotated[str, typer.Option(help="Durations of sagas finished within this.")] = "24h",
    stuck_after: StuckAfterOption = "15m",
    as_json: JsonOption = False,
    database_url: DatabaseUrlOption = None,
    broker_url: BrokerUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """Counts by name and status, p50/p95 durations, oldest running, stuck sagas, events
    published with no subscriber; queue depth and oldest message's age when the broker is
    PostgreSQL."""
    settings = settings_from(database_url=database_url, broker_url=broker_url, schema=schema)
    window_td, stuck_td = parse_duration(window), parse_duration(stuck_after)
    assert window_td is not None and stuck_td is not None
    with connect(settings) as conn:
        figures = collect(conn, settings.db_schema, window=window_td, stuck_after=stuck_td)
    queues = _broker_queues(settings)
    horizons = _vacuum_horizons(settings)
    if as_json:
        document: dict[str, Any] = {
            "counts": figures.counts,
            "durations": figures.durations,
            "oldest_running": {k: v.isoformat() for k, v in figures.oldest_running.items()},
            "stuck_count": figures.stuck_count,
            "stuck": [
                {**s, "id": str(s["id"]), "updated_at": s["updated_at"].isoformat()}
                for s in figures.stuck
            ],
            "unrouted_events": {
                u.message_type: {
                    "events": u.events,
                    "first_at": u.first_at.isoformat(),
                    "last_at": u.last_at.isoformat(),
                }
                for u in figures.unrouted_events
            },
        }
        if queues is not None:
            document["broker_queues"] = {name: asdict(q) for name, q in queues.items()}
        document["vacuum"] = {place: asdict(h) for place, h in horizons.items()}
        print(json.dumps(document, indent=2))
        return
    now = datetime.now(UTC)
    table = Table(title="sagas")
    table.add_column("name")
    for status in SagaStatus:
        table.add_column(status.value, justify="right")
    table.add_column(f"p50 / p95 ({window})", justify="right")
    table.add_column("oldest running", justify="right")
    for name in sorted(figures.counts):
        counts = figures.counts[name]
        duration = figures.durations.get(name)
        oldest = figures.oldest_running.get(name)
        table.add_row(
            foreign(name),
            *(f"{counts.get(s.value, 0):,}" for s in SagaStatus),
            f"{duration['p50_s']:.2f}s / {duration['p95_s']:.2f}s" if duration else "",
            f"{(now - oldest).total_seconds():.0f}s ago" if oldest else "",
        )
    print_table(table)
    style = "red" if figures.stuck_count else "green"
    console.print(
        foreign(f"{figures.stuck_count} stuck (no progress for {stuck_after})", style=style)
    )
    for s in figures.stuck:
        console.print(
            foreign(
                f"  {s['id']}  {s['name']}  {s['status']} at "
                f"{step_text(s['step'], s['waiting_on'])}"
            ),
            soft_wrap=True,
        )
    if figures.unrouted_events:
        _print_unrouted(figures.unrouted_events)
    if queues is not None:
        _print_queues(queues)
    _print_horizons(horizons)


def _print_horizons(horizons: dict[str, VacuumHorizon]) -> None:
    """The oldest open transaction of each database (what vacuum waits for), and the
    framework's tables by dead tuples."""
    table = Table(title="vacuum: oldest open transaction, dead tuples")
    for column in ("database", "oldest transaction", "client", "state", "table", "dead"):
        table.add_column(column, justify="right" if column == "dead" else "left")
    for place, horizon in horizons.items():
        held = horizon.oldest
        age = "" if held is None or held.age_s is None else f"{held.age_s:.0f}s"
        # application names and states are the sessions' own text: shown as data
        client = foreign(
            "" if held is None else f"{held.application or '?'} ({held.client or 'local'})"
        )
        state = foreign("" if held is None else held.state or "?")
        tables = list(horizon.dead_tuples.items())[:5] or [("", 0)]
        for n, (name, dead) in enumerate(tables):
            first = n == 0
            table.add_row(
                place if first else "", age if first else "", client if first else "",
                state if first else "", name, f"{dead:,}" if name else "",
            )  # fmt: skip
    print_table(table)


def _print_queues(queues: dict[str, QueueDepth]) -> None:
    table = Table(title="broker queues (PostgreSQL)")
    for column in ("queue", "depth", "ready", "in flight", "delayed", "oldest"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for name, q in queues.items():
        table.add_row(
            foreign(name), f"{q.depth:,}", f"{q.ready:,}", f"{q.in_flight:,}", f"{q.delayed:,}",
            f"{q.oldest_age_s:.1f}s",
        )  # fmt: skip
    print_table(table)


def _print_unrouted(unrouted: list[UnroutedEvents]) -> None:
    table = Table(title="events published with no subscriber (delivered to nobody)")
    for column in ("event", "events", "first", "last"):
        table.add_column(column, justify="left" if column == "event" else "right")
    for u in unrouted:
        table.add_row(
            foreign(u.message_type), f"{u.events:,}", f"{u.first_at:%Y-%m-%d %H:%M:%S}",
            f"{u.last_at:%Y-%m-%d %H:%M:%S}",
        )  # fmt: skip
    print_table(table)
