"""``saga signal``: deliver an event to a waiting saga."""

from __future__ import annotations

import json
from typing import Annotated, Any
from uuid import UUID

import typer

from saga.cli.loading import load_registry
from saga.cli.options import DatabaseUrlOption, RegistryOption
from saga.cli.output import console
from saga.cli.runtime import connect, settings_from
from saga.cli.text import foreign
from saga.errors import SignalRejected


def signal(
    saga_id: Annotated[UUID, typer.Argument(help="The waiting saga's id.")],
    event: Annotated[str, typer.Argument(help="The event it waits for, e.g. approval.")],
    registry: RegistryOption,
    data: Annotated[str, typer.Option(help="The event's data as a JSON object.")] = "{}",
    database_url: DatabaseUrlOption = None,
) -> None:
    """Deliver an external event to a saga waiting for it (checked before it is sent).

    The registry's definitions check the data with the waiting step's model, as
    ``registry.signal`` does in application code; the registry names the schema.
    """
    try:
        payload: Any = json.loads(data)
    except json.JSONDecodeError as exc:
        raise SignalRejected(f"--data is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise SignalRejected("--data must be a JSON object")
    settings = settings_from(database_url=database_url)
    target = load_registry(registry)
    with connect(settings) as conn, conn.transaction():
        target.signal(conn, saga_id, event, payload)
    console.print(foreign(f"{event} sent to saga {saga_id}", style="green"), soft_wrap=True)
