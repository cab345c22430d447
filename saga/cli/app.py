"""The ``saga`` command."""

from __future__ import annotations

import sys

import typer
from rich.text import Text

from saga.cli import (
    cancel,
    consume,
    dashboard,
    db,
    demo,
    dlq,
    relay,
    resume,
    sagas,
    signal,
    stats,
    subscriptions,
    versions,
)
from saga.cli.output import err_console
from saga.cli.text import foreign
from saga.errors import ConfigurationError, SagaError

app = typer.Typer(
    name="saga",
    help="Outbox-based sagas on PostgreSQL: migrate, relay, consume, inspect.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(db.app, name="db")
app.add_typer(dlq.app, name="dlq")
app.command("relay")(relay.relay)
app.command("consume")(consume.consume)
app.command("list")(sagas.list_sagas)
app.command("show")(sagas.show_saga)
app.command("cancel")(cancel.cancel_saga)
app.command("stats")(stats.stats)
app.command("subscriptions")(subscriptions.subscriptions)
app.command("resume")(resume.resume)
app.command("signal")(signal.signal)
app.command("versions")(versions.versions)
app.command("migrate-instances")(versions.migrate_instances)
app.command("demo")(demo.demo)
app.command("dashboard")(dashboard.dashboard)


def main() -> None:
    try:
        app()
    except ConfigurationError as exc:
        err_console.print(_failure("configuration error", exc), soft_wrap=True)
        sys.exit(2)
    except SagaError as exc:
        err_console.print(_failure("error", exc), soft_wrap=True)
        sys.exit(1)


def _failure(label: str, exc: Exception) -> Text:
    """``label: message``, the message as written (it may quote data, an extra's name in
    brackets, or an operator's input)."""
    return Text.assemble((f"{label}:", "red"), " ", foreign(exc, multiline=True))
