"""``saga db``: schema migrations."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer
from rich.table import Table

from saga.cli.durations import parse_duration
from saga.cli.options import DatabaseUrlOption, SchemaOption
from saga.cli.output import console, print_table
from saga.cli.runtime import connect, settings_from
from saga.cli.text import foreign
from saga.db import schema as migrations
from saga.operations import roles
from saga.operations.retention import Pruner, RetentionPolicy

app = typer.Typer(help="Create and upgrade the framework's tables.", no_args_is_help=True)


@app.command("migrate")
def migrate_command(database_url: DatabaseUrlOption = None, schema: SchemaOption = None) -> None:
    """Apply every pending migration (safe to run from several processes at once).

    From Python (a test fixture, an application's start-up hook):
    saga.db.schema.migrate(conn, schema).
    """
    settings = settings_from(database_url=database_url, schema=schema)
    with connect(settings) as conn:
        applied = migrations.migrate(conn, settings.db_schema)
    if applied:
        for migration in applied:
            console.print(f"applied {migration.version:04d}_{migration.name}")
        console.print(
            f"[green]schema {settings.db_schema!r} is up to date ({len(applied)} applied)"
        )
    else:
        console.print(f"[green]schema {settings.db_schema!r} is up to date (nothing to apply)")


@app.command("status")
def status_command(database_url: DatabaseUrlOption = None, schema: SchemaOption = None) -> None:
    """List applied and pending migrations (from Python: saga.db.schema.status(conn, schema))."""
    settings = settings_from(database_url=database_url, schema=schema)
    with connect(settings) as conn:
        states = migrations.status(conn, settings.db_schema)
    table = Table(title=f"migrations in schema {settings.db_schema!r}")
    table.add_column("version", justify="right")
    table.add_column("name")
    table.add_column("state")
    table.add_column("applied at")
    for state in states:
        label = "applied" if state.applied else "[yellow]pending"
        if state.applied and not state.checksum_matches:
            label = "[red]applied (file changed since)"
        table.add_row(
            f"{state.migration.version:04d}",
            state.migration.name,
            label,
            state.applied_at.isoformat(timespec="seconds") if state.applied_at else "",
        )
    print_table(table)
    pending = sum(1 for s in states if not s.applied)
    console.print(f"{len(states) - pending} applied, {pending} pending")


@app.command("prune")
def prune_command(
    dedup_window: Annotated[
        str, typer.Option(help="Keep inbox rows this long (must exceed dead-letter retention).")
    ] = "30d",
    dead_letter_retention: Annotated[
        str, typer.Option(help="Keep replayed or purged dead letters this long.")
    ] = "14d",
    saga_retention: Annotated[
        str, typer.Option(help="Keep completed or compensated sagas and their step logs this long.")
    ] = "30d",
    batch_size: Annotated[int, typer.Option(help="Rows deleted per transaction.")] = 5000,
    dry_run: Annotated[
        bool, typer.Option(help="Count what would be deleted; delete nothing.")
    ] = False,
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """Delete rows past their retention, in small batches that do not block the hot path."""
    settings = settings_from(database_url=database_url, schema=schema)
    policy = RetentionPolicy(
        dedup_window=_duration(dedup_window),
        dead_letter_retention=_duration(dead_letter_retention),
        saga_retention=_duration(saga_retention),
        batch_size=batch_size,
    )
    pruner = Pruner(settings.db_schema, policy)
    with connect(settings) as conn:
        if dry_run:
            report = pruner.count(conn)
            verb = "would delete"
        else:
            with console.status("pruning") as status:
                report = pruner.prune(
                    conn, on_progress=lambda kind, n: status.update(f"pruning {kind}: {n} more")
                )
            verb = "deleted"
    for kind, count in report.deleted.items():
        console.print(f"{verb} {count:,} {kind.replace('_', ' ')} row(s)")


def _duration(text: str) -> timedelta:
    value = parse_duration(text)
    assert value is not None
    return value


@app.command("roles")
def roles_command(
    prefix: Annotated[
        str, typer.Option(help="Role names: PREFIX_relay, _service, _operator.")
    ] = "saga",
    apply: Annotated[bool, typer.Option(help="Run the SQL instead of printing it.")] = False,
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """Least-privilege roles: the relay, a service, and operators (SQL printed or applied)."""
    settings = settings_from(database_url=database_url, schema=schema)
    with connect(settings) as conn:
        rendered = [s.as_string(conn) for s in roles.statements(settings.db_schema, prefix)]
        if apply:
            with conn.transaction():
                for statement in rendered:
                    conn.execute(statement.encode())
            names = ", ".join(roles.role_names(prefix).values())
            console.print(
                foreign(f"roles {names} are ready", style="green") + "; grant them to login roles"
            )
            return
    for statement in rendered:
        print(statement + ";")
