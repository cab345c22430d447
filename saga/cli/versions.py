"""``saga versions`` and ``saga migrate-instances``: versions in use, moving sagas to newer."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from saga.cli.loading import load_registry
from saga.cli.options import DatabaseUrlOption, JsonOption, RegistryOption, SchemaOption
from saga.cli.output import console, print_table
from saga.cli.runtime import connect, settings_from
from saga.cli.text import foreign
from saga.engine.registry import MigrationReport
from saga.engine.store import SagaStore


def versions(
    as_json: JsonOption = False,
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """Per saga name and version: how many are running, waiting, stopped and finished, and
    the fingerprint of the definition recorded for it (when a consumer of its registry
    first connected)."""
    settings = settings_from(database_url=database_url, schema=schema)
    with connect(settings) as conn:
        rows = SagaStore(settings.db_schema).versions(conn)
    keys = ("name", "version", "running", "waiting", "needs_operator", "finished", "definition")
    if as_json:
        print(json.dumps([dict(zip(keys, row, strict=True)) for row in rows], indent=2))
        return
    table = Table(title="saga versions")
    for key in keys:
        table.add_column(key.replace("_", " "), justify="left" if key == "name" else "right")
    for row in rows:
        table.add_row(*(f"{v:,}" if isinstance(v, int) else foreign(v or "-") for v in row))
    print_table(table)


def migrate_instances(
    name: Annotated[str, typer.Argument(help="The saga name.")],
    to: Annotated[int, typer.Option("--to", help="The version to move running sagas to.")],
    registry: RegistryOption,
    dry_run: Annotated[bool, typer.Option(help="Count who would move and who stays.")] = False,
    batch_size: Annotated[int, typer.Option(help="Sagas moved per transaction.")] = 500,
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """Move running sagas of older versions to a newer one, by its migrate_from rules."""
    settings = settings_from(database_url=database_url, schema=schema)
    target = load_registry(registry)
    with connect(settings) as conn:
        plan = target.migrate_instances(conn, name, to, dry_run=True)
        total = sum(plan.moved.values())
        if dry_run:
            _print_report(plan, to, dry_run=True)
            console.print("dry run: nothing changed")
            return
        with Progress(
            TextColumn("migrating"), BarColumn(), MofNCompleteColumn(), console=console
        ) as progress:
            task = progress.add_task("migrate", total=total)
            report = target.migrate_instances(
                conn,
                name,
                to,
                batch_size=batch_size,
                on_progress=lambda n: progress.advance(task, n),
            )
    _print_report(report, to, dry_run=False)


def _print_report(report: MigrationReport, to: int, *, dry_run: bool) -> None:
    for version in sorted(report.moved):
        count = report.moved[version]
        moved = f"{count:,} would move" if dry_run else f"moved {count:,}"
        console.print(
            f"v{version} -> v{to}: {moved}, "
            f"{report.stayed[version]:,} stay (already past the guard step)"
        )
