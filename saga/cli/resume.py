"""``saga resume``: restart one stopped saga, or every stuck one."""

from __future__ import annotations

from collections import Counter
from typing import Annotated
from uuid import UUID

import typer
from rich.progress import Progress
from rich.table import Table

from saga.cli.durations import parse_duration
from saga.cli.options import DatabaseUrlOption, SchemaOption, StuckAfterOption
from saga.cli.output import console, err_console, print_table
from saga.cli.runtime import connect, settings_from
from saga.cli.text import foreign
from saga.operations.resume import SagaResumer, StuckFilter
from saga.settings import Settings


def resume(
    saga_id: Annotated[
        UUID | None,
        typer.Argument(help="The saga's id; without it, every stuck saga the options select."),
    ] = None,
    stuck_after: StuckAfterOption = "15m",
    name: Annotated[str | None, typer.Option(help="Every stuck saga: only this name.")] = None,
    older_than: Annotated[
        str | None, typer.Option(help="Every stuck saga: only those started before this long ago.")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Every stuck saga: only those started within this long.")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Every stuck saga: at most this many.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Every stuck saga: list them, resume none.")
    ] = False,
    reason: Annotated[str, typer.Option(help="Recorded in the logs.")] = "operator",
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """Restart a saga that failed to compensate, failed after its pivot, or is stuck;
    without an id, every stuck saga (running or compensating with no progress for
    --stuck-after), e.g. after a broker lost messages."""
    settings = settings_from(database_url=database_url, schema=schema)
    resumer = SagaResumer(settings.db_schema)
    stuck_td = parse_duration(stuck_after)
    assert stuck_td is not None
    if saga_id is None:
        which = StuckFilter(
            stuck_td, name, parse_duration(older_than), parse_duration(since), limit
        )
        _resume_stuck(settings, resumer, which, reason=reason, dry_run=dry_run)
        return
    if name or older_than or since or limit or dry_run:
        raise typer.BadParameter(
            "--name, --older-than, --since, --limit and --dry-run select stuck sagas: "
            "give them without a saga id"
        )
    with connect(settings) as conn, conn.transaction():
        service = resumer.resume(conn, saga_id, stuck_after=stuck_td, reason=reason)
    console.print(
        foreign(f"resume of saga {saga_id} sent to {service!r}", style="green"), soft_wrap=True
    )


def _resume_stuck(
    settings: Settings, resumer: SagaResumer, which: StuckFilter, *, reason: str, dry_run: bool
) -> None:
    with connect(settings) as conn:
        stuck = resumer.find_stuck(conn, which)
        conn.commit()
        groups = Counter((s.name, s.status, s.step or "") for s in stuck)
        table = Table(title=f"{len(stuck)} stuck saga(s) (no progress for {which.stuck_after})")
        for column in ("name", "status", "step", "sagas"):
            table.add_column(column, justify="right" if column == "sagas" else "left")
        for (saga_name, status, step), number in sorted(groups.items()):
            table.add_row(foreign(saga_name), foreign(status), foreign(step), f"{number:,}")
        print_table(table)
        if dry_run or not stuck:
            console.print(f"{'dry run: ' if dry_run else ''}{len(stuck)} saga(s) to resume")
            return
        with Progress(console=err_console) as bar:
            task = bar.add_task("resuming", total=len(stuck))
            resumed = resumer.resume_stuck(
                conn, stuck, reason=reason, progress=lambda n: bar.advance(task, n)
            )
    services = Counter(s.service for s in stuck)
    sent = ", ".join(f"{number} to {service!r}" for service, number in sorted(services.items()))
    console.print(foreign(f"resumed {resumed} saga(s): {sent}", style="green"), soft_wrap=True)
