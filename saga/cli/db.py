"""``saga db``: schema migrations."""

from __future__ import annotations

import typer
from rich.table import Table

from saga import migrate as migrations
from saga.cli.common import DatabaseUrlOption, SchemaOption, connect, console, settings_from

app = typer.Typer(help="Create and upgrade the framework's tables.", no_args_is_help=True)


@app.command("migrate")
def migrate_command(database_url: DatabaseUrlOption = None, schema: SchemaOption = None) -> None:
    """Apply every pending migration (safe to run from several processes at once)."""
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
    """List applied and pending migrations."""
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
    console.print(table)
    pending = sum(1 for s in states if not s.applied)
    console.print(f"{len(states) - pending} applied, {pending} pending")
