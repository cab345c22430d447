"""``saga cancel``: ask a running saga to compensate."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

import typer

from saga.cli.options import DatabaseUrlOption, SchemaOption
from saga.cli.output import console
from saga.cli.runtime import connect, settings_from
from saga.engine.orchestrator import request_cancel
from saga.engine.store import SagaStore


def cancel_saga(
    saga_id: Annotated[UUID, typer.Argument(help="The saga's id.")],
    reason: Annotated[str, typer.Option(help="Recorded as the saga's last error.")] = "operator",
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """Ask a running saga to compensate from where it is (refused past its pivot)."""
    settings = settings_from(database_url=database_url, schema=schema)
    with connect(settings) as conn, conn.transaction():
        request_cancel(SagaStore(settings.db_schema), conn, saga_id, reason)
    console.print(
        f"[yellow]saga {saga_id} will compensate as soon as its pending step answers[/yellow]"
    )
