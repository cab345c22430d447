"""``saga dashboard``: serve the operators' web pages over the services' databases."""

from __future__ import annotations

import os
import signal
from typing import Annotated

import typer

from saga.broker.transport import BrokerConfig, Topology
from saga.cli.options import BrokerUrlOption, QueuePrefixOption, SchemaOption
from saga.cli.output import console, err_console
from saga.cli.runtime import settings_from
from saga.cli.text import foreign
from saga.errors import ConfigurationError
from saga.settings import ENV_DATABASE_URL

DEFAULT_PORT = 8600
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def dashboard(
    database_urls: Annotated[
        list[str] | None,
        typer.Option(
            "--database-url",
            "--db",
            help="A service's database as SERVICE=URL (orders=postgresql://host/orders); "
            "repeat for each service. A bare URL is labelled by its database name. "
            f"Env: {ENV_DATABASE_URL} (one bare URL).",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on; only this machine by default.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = DEFAULT_PORT,
    broker_url: BrokerUrlOption = None,
    queue_prefix: QueuePrefixOption = "saga.",
    schema: SchemaOption = None,
) -> None:
    """Web pages for operators: overview, sagas, a saga's timeline, dead letters.

    Read-only unless SAGA_DASHBOARD_TOKEN is set: then an operator who signs in with
    it can replay, purge, cancel and resume, and each action is recorded.
    """
    try:
        import uvicorn

        from saga.dashboard.app import DashboardConfig, create_app
        from saga.dashboard.databases import Databases, parse_databases
        from saga.dashboard.security import ENV_TOKEN, Guard
    except ImportError as exc:
        raise ConfigurationError(
            f"the dashboard needs its extra: pip install 'saga-outbox[dashboard]' ({exc})"
        ) from None
    settings = settings_from(broker_url=broker_url, schema=schema)
    specs = database_urls or ([settings.database_url] if settings.database_url else [])
    databases = Databases(
        parse_databases(specs, settings.db_schema), access=settings.database_access()
    )
    guard = Guard(os.environ.get(ENV_TOKEN) or None)
    broker = BrokerConfig(settings.broker_url) if settings.broker_url else None
    topology = Topology(queue_prefix=queue_prefix)
    app = create_app(DashboardConfig(databases, guard, broker, topology))
    if host not in LOOPBACK:
        err_console.print(
            foreign(f"listening on {host}: other hosts can reach this dashboard", style="yellow")
        )
    mode = "read-only" if guard.read_only else f"actions allowed with {ENV_TOKEN}"
    console.print(
        foreign(f"saga dashboard on http://{host}:{port}/ over {', '.join(databases.services)}")
        + f" ({mode})",
        soft_wrap=True,
    )
    # uvicorn stops gracefully on SIGTERM or SIGINT, then raises the signal again for the
    # handler that was in place: this one lets the command end with status 0.
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, lambda _signum, _frame: None)
    uvicorn.run(app, host=host, port=port, log_level="warning")
