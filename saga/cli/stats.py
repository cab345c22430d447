"""``saga stats``: counts, durations, oldest running and stuck sagas."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from saga.cli.common import (
    DatabaseUrlOption,
    JsonOption,
    SchemaOption,
    StuckAfterOption,
    connect,
    console,
    settings_from,
)
from saga.cli.durations import parse_duration
from saga.engine.state import SagaStatus
from saga.operations.stats import collect


def stats(
    window: Annotated[str, typer.Option(help="Durations of sagas finished within this.")] = "24h",
    stuck_after: StuckAfterOption = "15m",
    as_json: JsonOption = False,
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """Counts by name and status, p50/p95 durations, oldest running, stuck sagas."""
    settings = settings_from(database_url=database_url, schema=schema)
    window_td, stuck_td = parse_duration(window), parse_duration(stuck_after)
    assert window_td is not None and stuck_td is not None
    with connect(settings) as conn:
        figures = collect(conn, settings.db_schema, window=window_td, stuck_after=stuck_td)
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
        }
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
            name,
            *(f"{counts.get(s.value, 0):,}" for s in SagaStatus),
            f"{duration['p50_s']:.2f}s / {duration['p95_s']:.2f}s" if duration else "",
            f"{(now - oldest).total_seconds():.0f}s ago" if oldest else "",
        )
    console.print(table)
    style = "red" if figures.stuck_count else "green"
    console.print(f"[{style}]{figures.stuck_count} stuck (no progress for {stuck_after})")
    for s in figures.stuck:
        console.print(f"  {s['id']}  {s['name']}  {s['status']} at {s['step']}")
