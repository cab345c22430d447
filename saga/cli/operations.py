"""``saga stats`` and ``saga resume``: the health of sagas, and restarting a stopped one."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID

import typer
from rich.table import Table

from saga.cli.common import (
    DatabaseUrlOption,
    JsonOption,
    SchemaOption,
    connect,
    console,
    settings_from,
)
from saga.cli.durations import parse_duration
from saga.dead_letters import DeadLetterFilter, DeadLetterStore
from saga.errors import SagaError, UnknownSaga
from saga.outbox import Outbox
from saga.replies import ResumeSaga
from saga.state import SagaStatus
from saga.stats import collect
from saga.store import SagaStore

StuckAfterOption = Annotated[
    str, typer.Option(help="A running saga with no progress for this long is stuck.")
]


class NotResumable(SagaError):
    pass


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


def resume(
    saga_id: Annotated[UUID, typer.Argument(help="The saga's id.")],
    stuck_after: StuckAfterOption = "15m",
    reason: Annotated[str, typer.Option(help="Recorded in the logs.")] = "operator",
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """Restart a saga that failed to compensate, failed after its pivot, or is stuck."""
    settings = settings_from(database_url=database_url, schema=schema)
    store = SagaStore(settings.db_schema)
    stuck_td = parse_duration(stuck_after)
    assert stuck_td is not None
    with connect(settings) as conn, conn.transaction():
        record = store.load(conn, saga_id)
        if record is None:
            raise UnknownSaga(f"no saga {saga_id} in schema {settings.db_schema!r}")
        if record.status.finished:
            raise NotResumable(f"saga {saga_id} is {record.status.value}; nothing to resume")
        if not record.status.needs_operator:
            idle = datetime.now(UTC) - (record.updated_at or datetime.now(UTC))
            if idle < stuck_td:
                raise NotResumable(
                    f"saga {saga_id} is {record.status.value} and progressed "
                    f"{idle.total_seconds():.0f}s ago; it is not stuck "
                    f"(use --stuck-after to lower the threshold)"
                )
        Outbox(settings.db_schema).add(
            conn,
            ResumeSaga(saga_id=saga_id, reason=reason),
            destination=record.service,
            saga_id=saga_id,
        )
        _close_saga_dead_letters(conn, settings.db_schema, saga_id)
    console.print(f"[green]resume of saga {saga_id} sent to {record.service!r}[/green]")


def _close_saga_dead_letters(conn: Any, schema: str, saga_id: UUID) -> None:
    """Resuming answers the saga's own dead letters: mark them replayed, and record it."""
    store = DeadLetterStore(schema)
    letters = [
        letter
        for letter in store.find(conn, DeadLetterFilter(status="pending", saga_id=saga_id))
        if letter.error_type in ("CompensationFailed", "ForwardStepFailed")
    ]
    if letters:
        ids = [letter.id for letter in letters]
        store.mark_replayed(conn, ids)
        store.record_replay(
            conn, {"command": "saga resume", "saga_id": str(saga_id)}, ids, len(ids), 0, "resumed"
        )
