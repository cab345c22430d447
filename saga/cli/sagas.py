"""``saga list`` and ``saga show``: looking at sagas."""

from __future__ import annotations

import json
from typing import Annotated, Any
from uuid import UUID

import typer
from rich.table import Table
from rich.text import Text

from saga.cli.durations import parse_duration
from saga.cli.options import DatabaseUrlOption, JsonOption, SchemaOption
from saga.cli.output import console, iso, print_table
from saga.cli.runtime import connect, settings_from
from saga.cli.text import foreign
from saga.engine.state import SagaRecord, SagaStatus
from saga.engine.store import SagaFilter, SagaStore
from saga.errors import UnknownSaga
from saga.operations.branches import branches

STATUS_STYLE = {
    "running": "cyan",
    "compensating": "yellow",
    "completed": "green",
    "compensated": "magenta",
    "compensation_failed": "bold red",
    "forward_failed": "bold red",
    "step_dead_lettered": "bold red",
}


def list_sagas(
    status: Annotated[
        str | None, typer.Option(help="Only this status: " + ", ".join(s.value for s in SagaStatus))
    ] = None,
    name: Annotated[str | None, typer.Option(help="Only sagas of this name.")] = None,
    older_than: Annotated[
        str | None, typer.Option(help="Started before this long ago (1h).")
    ] = None,
    since: Annotated[str | None, typer.Option(help="Started within this long (30m, 2d).")] = None,
    key: Annotated[
        str | None, typer.Option(help="Only the saga started with this idempotency key.")
    ] = None,
    data: Annotated[
        list[str] | None,
        typer.Option(
            help="Only sagas whose data has this top-level field: field=text, or "
            "field:=JSON for a number, boolean or null (amount_cents:=4200). Repeatable.",
        ),
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    as_json: JsonOption = False,
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """List sagas, newest first."""
    if status is not None and status not in {s.value for s in SagaStatus}:
        raise typer.BadParameter(f"unknown status {status!r}", param_hint="--status")
    settings = settings_from(database_url=database_url, schema=schema)
    with connect(settings) as conn:
        where = SagaFilter(
            status=status,
            name=name,
            older_than=parse_duration(older_than),
            newer_than=parse_duration(since),
            key=key,
            data=data_filter(data or []),
            limit=limit,
        )
        rows = SagaStore(settings.db_schema).list(conn, where)
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "id": str(r.id),
                        "name": r.name,
                        "version": r.saga_version,
                        "status": r.status,
                        "step": r.step,
                        "waiting_on": r.waiting_on if r.step_state else None,
                        "last_error": r.last_error,
                        "started_at": iso(r.started_at),
                        "updated_at": iso(r.updated_at),
                        "finished_at": iso(r.finished_at),
                    }
                    for r in rows
                ],
                indent=2,
            )
        )
        return
    table = Table(title=f"{len(rows)} saga(s)")
    table.add_column("id", no_wrap=True)
    for column in ("name", "status", "step", "started", "last error"):
        table.add_column(column, overflow="fold")
    for r in rows:
        style = STATUS_STYLE.get(r.status, "")
        table.add_row(
            str(r.id),
            foreign(f"{r.name} v{r.saga_version}"),
            foreign(r.status, style=style),
            foreign(step_text(r.step, r.waiting_on)),
            r.started_at.strftime("%Y-%m-%d %H:%M:%S"),
            foreign(r.last_error),
        )
    print_table(table)


def step_text(step: str | None, waiting: list[str]) -> str | None:
    """A saga's step as listed: a parallel group with the members it still waits on
    (``reserve: reserve_stock, reserve_credit``)."""
    if waiting and waiting != [step]:
        return f"{step}: {', '.join(waiting)}"
    return step


def data_filter(pairs: list[str]) -> dict[str, Any]:
    """``--data`` values as the fields a saga's data must hold (``field=text``,
    ``field:=JSON``)."""
    fields: dict[str, Any] = {}
    for pair in pairs:
        field, sep, value = pair.partition("=")
        if not sep or not field.rstrip(":"):
            raise typer.BadParameter(
                f"{pair!r} is not field=value (or field:=JSON)", param_hint="--data"
            )
        if field.endswith(":"):
            try:
                fields[field[:-1]] = json.loads(value)
            except json.JSONDecodeError:
                raise typer.BadParameter(
                    f"{pair!r}: {value!r} is not JSON (write field=text for text)",
                    param_hint="--data",
                ) from None
        else:
            fields[field] = value
    return fields


def timeline_entries(
    timeline: list[tuple[Any, ...]], branch_of: dict[str, str]
) -> list[dict[str, Any]]:
    """The step log rows of one saga as plain dicts (durations in milliseconds), each
    forward step of a parallel group's member with its group (``branch_of``)."""
    return [
        {
            "step": step,
            "group": branch_of.get(step) if phase == "forward" else None,
            "phase": phase,
            "attempt": attempt,
            "outcome": outcome,
            "started_at": iso(started),
            "finished_at": iso(finished),
            "duration_ms": round((finished - started).total_seconds() * 1000, 1),
            "error": error,
            "message_id": str(message_id) if message_id else None,
        }
        for step, phase, attempt, outcome, started, finished, error, message_id in timeline
    ]


def render_saga(record: SagaRecord, steps: list[dict[str, Any]]) -> None:
    """Print a saga's state and its timeline (``saga show``, and the demo)."""
    style = STATUS_STYLE.get(record.status.value, "")
    console.print(
        Text.assemble(
            foreign(record.name, style="bold"),
            f" v{record.saga_version}  {record.id}  ",
            (record.status.value, style),
        ),
        soft_wrap=True,
    )
    if record.last_error:
        console.print(Text("last error: ") + foreign(record.last_error), soft_wrap=True)
    if record.waiting_on and record.waiting_on != [record.step]:
        waiting = ", ".join(record.waiting_on)
        console.print(Text("waiting on: ") + foreign(waiting), soft_wrap=True)
    if record.status is SagaStatus.STEP_DEAD_LETTERED:
        console.print(
            Text.assemble(
                "held at ",
                foreign(record.step),
                ": its command is a dead letter in the participant's database; "
                "`saga dlq replay` it to go on, or `saga dlq purge` it to compensate",
            ),
            soft_wrap=True,
        )
    table = Table(title="timeline")
    for column in ("#", "step", "phase", "try", "outcome", "ms", "error"):
        table.add_column(column, overflow="fold")
    group = None
    for i, s in enumerate(steps, 1):
        outcome_style = {"succeeded": "green", "failed": "red", "skipped": "dim"}.get(
            s["outcome"], ""
        )
        if s["group"] != group and s["group"] is not None:
            table.add_row("", Text("⫴ ") + foreign(s["group"], style="bold") + " (at once)")
        group = s["group"]
        table.add_row(
            str(i),
            Text("  ├ ") + foreign(s["step"]) if group else foreign(s["step"]),
            "↩ compensation" if s["phase"] == "compensation" else "→ forward",
            str(s["attempt"]),
            foreign(s["outcome"], style=outcome_style),
            f"{s['duration_ms']:.1f}",
            foreign(s["error"]),
        )
    print_table(table)


def show_saga(
    saga_id: Annotated[UUID, typer.Argument(help="The saga's id.")],
    as_json: JsonOption = False,
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """Show one saga: its state and the timeline of every step and compensation."""
    settings = settings_from(database_url=database_url, schema=schema)
    store = SagaStore(settings.db_schema)
    with connect(settings) as conn:
        record = store.load(conn, saga_id)
        if record is None:
            raise UnknownSaga(f"no saga {saga_id} in schema {settings.db_schema!r}")
        timeline = store.timeline(conn, saga_id)
        branch_of = branches(conn, settings.db_schema, record.name, record.saga_version)
    steps = timeline_entries(timeline, branch_of)
    if as_json:
        print(
            json.dumps(
                {
                    "id": str(record.id),
                    "name": record.name,
                    "version": record.saga_version,
                    "status": record.status.value,
                    "step": record.step,
                    "waiting_on": record.waiting_on if record.step_state else None,
                    "completed_steps": record.completed_steps,
                    "cancel_requested": record.cancel_requested,
                    "last_error": record.last_error,
                    "data": record.data,
                    "started_at": iso(record.started_at),
                    "finished_at": iso(record.finished_at),
                    "timeline": steps,
                },
                indent=2,
            )
        )
        return
    render_saga(record, steps)
