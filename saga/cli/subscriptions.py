"""``saga subscriptions``: who subscribes to which events, per service and broker.

Each consumer service records the bindings it declares in its own database every time a
worker connects (``saga.subscriptions``): this command lists them for every database
named (several ``--database-url``: one per service). With a PostgreSQL broker it also
lists the broker's own routing table, the bindings the relays publish through.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from saga.broker.bindings import Binding
from saga.broker.transport import BrokerConfig
from saga.cli.options import BrokerUrlOption, JsonOption, SchemaOption
from saga.cli.output import console, iso, print_table
from saga.cli.runtime import connect, settings_from
from saga.cli.text import foreign
from saga.messaging.events import EventRecords, Subscription
from saga.observability.redaction import redact_url
from saga.settings import ENV_DATABASE_URL, Settings

DatabaseUrlsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--database-url",
        help="A service's database (repeat it, one per service). Default: the one in "
        f"{ENV_DATABASE_URL}.",
        show_default=False,
    ),
]


def _read(settings: Settings, url: str, what: str, read: Any) -> Any:
    with connect(settings, url, what=what, autocommit=True) as conn:
        return read(conn)


def subscriptions(
    database_url: DatabaseUrlsOption = None,
    broker_url: BrokerUrlOption = None,
    schema: SchemaOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the events each service subscribes to (recorded in its database when it
    connects), and the PostgreSQL broker's bindings."""
    settings = settings_from(broker_url=broker_url, schema=schema)
    urls = database_url or [settings.require_database_url()]
    records = EventRecords(settings.db_schema)
    found: dict[str, list[Subscription]] = {
        redact_url(url): _read(settings, url, redact_url(url), records.subscriptions)
        for url in urls
    }
    bindings: list[Binding] | None = None
    broker = BrokerConfig(settings.broker_url) if settings.broker_url else None
    if broker is not None and broker.capabilities.routing_table:
        bindings = broker.bindings(settings.database_access())
    if as_json:
        document: dict[str, Any] = {
            "services": [
                {"database": where, **_subscription(s)}
                for where, rows in found.items()
                for s in rows
            ]
        }
        if bindings is not None:
            document["broker_bindings"] = [
                {"exchange": b.exchange, "event": b.routing_key, "queue": b.queue,
                 "since": iso(b.created_at)}
                for b in bindings
            ]  # fmt: skip
        print(json.dumps(document, indent=2))
        return
    table = Table(title="subscriptions (recorded by each service when it connects)")
    for column in ("service", "event", "queue", "broker", "since", "last connected", "database"):
        table.add_column(column)
    for where, rows in found.items():
        for s in rows:
            table.add_row(
                foreign(s.consumer), foreign(s.message_type), foreign(s.queue),
                foreign(s.broker), f"{s.first_declared_at:%Y-%m-%d %H:%M:%S}",
                f"{s.last_declared_at:%Y-%m-%d %H:%M:%S}", foreign(where),
            )  # fmt: skip
    print_table(table)
    if not any(found.values()):
        console.print("no subscriptions recorded: no service subscribing to events has connected")
    if bindings is not None:
        _print_bindings(bindings)


def _subscription(s: Subscription) -> dict[str, Any]:
    return {
        "service": s.consumer,
        "event": s.message_type,
        "queue": s.queue,
        "broker": s.broker,
        "since": iso(s.first_declared_at),
        "last_connected": iso(s.last_declared_at),
    }


def _print_bindings(bindings: list[Binding]) -> None:
    table = Table(title="bindings of the PostgreSQL broker (what the relays publish through)")
    for column in ("exchange", "event", "queue", "since"):
        table.add_column(column)
    for b in bindings:
        table.add_row(
            foreign(b.exchange), foreign(b.routing_key), foreign(b.queue),
            f"{b.created_at:%Y-%m-%d %H:%M:%S}",
        )  # fmt: skip
    print_table(table)
