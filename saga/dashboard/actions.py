"""What an operator changes from the dashboard: replay or purge dead letters, cancel or
resume a saga, through the same operations as ``saga dlq``, ``saga cancel`` and ``saga
resume``. Each action is recorded in ``dashboard_actions`` of the database it changed:
who (the signed-in operator and the client's address), when, what, and the outcome."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from saga.dashboard.databases import Databases
from saga.db.sql import Tx, render
from saga.engine.orchestrator import request_cancel
from saga.engine.store import SagaStore
from saga.errors import DeadLetterNotFound
from saga.messaging.dead_letters import DeadLetterFilter, DeadLetterStore
from saga.operations.replay import purge, replay
from saga.operations.resume import SagaResumer

_RECORD = """
INSERT INTO {schema}.dashboard_actions (operator, client, action, target, result)
VALUES (%s, %s, %s, %s, %s)
"""

_RECENT = """
SELECT id, acted_at, operator, client, action, target, result
FROM {schema}.dashboard_actions ORDER BY id DESC LIMIT %s
"""

#: A resume from the dashboard: the operator looked at the saga and chose to resume it.
RESUME_ANY_IDLE = timedelta(0)


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts: the operator's name from the session, and the client's address."""

    operator: str
    client: str | None


@dataclass(frozen=True, slots=True)
class RecordedAction:
    id: int
    acted_at: Any
    operator: str
    client: str | None
    action: str
    target: dict[str, Any]
    result: str


def record(
    tx: Tx,
    schema: str,
    actor: Actor,
    action: str,
    target: dict[str, Any],
    result: str,
) -> None:
    tx.execute(
        render(_RECORD, schema), (actor.operator, actor.client, action, Jsonb(target), result)
    )


def recent(databases: Databases, service: str, limit: int = 100) -> list[RecordedAction]:
    schema = databases.database(service).schema
    with databases.connect(service) as conn:
        rows = conn.execute(render(_RECENT, schema), (limit,)).fetchall()
    return [RecordedAction(*row) for row in rows]


def _letters(tx: Tx, schema: str, where: DeadLetterFilter) -> list[Any]:
    letters = DeadLetterStore(schema).find(tx, where)
    if where.ids is not None:
        missing = sorted(set(where.ids) - {letter.id for letter in letters})
        if missing:
            raise DeadLetterNotFound(f"no such dead letters (or not pending): {missing}")
    return letters


def _act(
    databases: Databases,
    service: str,
    actor: Actor,
    action: str,
    target: dict[str, Any],
    do: Callable[[psycopg.Connection[Any], str], str],
    *,
    one_transaction: bool,
) -> str:
    """Run ``do`` on ``service``'s database and record it there; return its summary.

    ``one_transaction``: ``do`` and its record commit together (replay and purge commit
    their own batches, then the record).
    """
    schema = databases.database(service).schema
    with (
        databases.connect(service) as conn,
        conn.transaction() if one_transaction else nullcontext(),
    ):
        summary = do(conn, schema)
        record(conn, schema, actor, action, {"service": service, **target}, summary)
    return summary


def replay_letters(
    databases: Databases, service: str, where: DeadLetterFilter, actor: Actor
) -> str:
    """Replay the letters ``where`` selects (superseded ones are refused); recorded."""
    criteria = {**where.describe(), "command": "saga dashboard", "operator": actor.operator}

    def do(tx: Tx, schema: str) -> str:
        result = replay(tx, _letters(tx, schema, where), criteria, schema=schema)
        refused = "; ".join(f"{i}: {why}" for i, why in result.refused.items())
        return f"replayed {len(result.replayed)} dead letter(s)" + (
            f", refused {len(result.refused)}: {refused}" if refused else ""
        )

    return _act(databases, service, actor, "replay", where.describe(), do, one_transaction=False)


def purge_letters(databases: Databases, service: str, where: DeadLetterFilter, actor: Actor) -> str:
    """Purge the letters ``where`` selects (a held saga then compensates); recorded."""

    def do(tx: Tx, schema: str) -> str:
        return f"purged {purge(tx, _letters(tx, schema, where), schema=schema)} dead letter(s)"

    return _act(databases, service, actor, "purge", where.describe(), do, one_transaction=False)


def cancel_saga(databases: Databases, service: str, saga_id: UUID, actor: Actor) -> str:
    """Ask a running saga to compensate (refused past its pivot); recorded."""

    def do(tx: Tx, schema: str) -> str:
        request_cancel(SagaStore(schema), tx, saga_id, f"dashboard: {actor.operator}")
        return f"saga {saga_id} will compensate as soon as its pending step answers"

    target = {"saga_id": str(saga_id)}
    return _act(databases, service, actor, "cancel", target, do, one_transaction=True)


def resume_saga(databases: Databases, service: str, saga_id: UUID, actor: Actor) -> str:
    """Send a saga a resume (as ``saga resume ID``, whatever its idle time); recorded."""

    def do(tx: Tx, schema: str) -> str:
        home = SagaResumer(schema).resume(
            tx, saga_id, stuck_after=RESUME_ANY_IDLE, reason=f"dashboard: {actor.operator}"
        )
        return f"resume of saga {saga_id} sent to {home!r}"

    target = {"saga_id": str(saga_id)}
    return _act(databases, service, actor, "resume", target, do, one_transaction=True)
