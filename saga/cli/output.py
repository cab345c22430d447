"""What the ``saga`` subcommands print: the consoles, whole tables, timestamps for ``--json``."""

from __future__ import annotations

from datetime import datetime

from rich.console import Console
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


def print_table(table: Table) -> None:
    """Print ``table`` whole: on a terminal, cells and headers too wide fold onto more
    lines (never cut to ``compe…``); piped or redirected, at its full width, whatever
    ``COLUMNS`` says."""
    for column in table.columns:
        column.overflow = "fold"
    if console.is_terminal:
        console.print(table)
        return
    whole = Console(width=10_000, color_system=None)
    whole.width = max(console.width, whole.measure(table).maximum)
    whole.print(table, crop=False)


def iso(value: datetime | None) -> str | None:
    """A timestamp as ISO 8601 text for ``--json`` output (None stays None)."""
    return value.isoformat() if value is not None else None
