"""What an operator changes from the dashboard: replay or purge dead letters, cancel or
resume a saga, through the same operations as ``saga dlq``, ``saga cancel`` and ``saga
resume``. Each action is recorded in ``dashboard_actions`` of the database it changed:
who (the signed-in operator and the client's address), when, what, and the outcome."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from saga.dashboard.sources import Databases
from saga.db.sql import render
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
    conn: psycopg.Connection[Any],
    schema: str,
    actor: Actor,
    action: str,
    target: dict[str, Any],
    result: str,
) -> None:
    conn.execute(
        render(_RECORD, schema), (actor.operator, actor.client, action, Jsonb(target), result)
    )


def recent(databases: Databases, service: str, limit: int = 100) -> list[RecordedAction]:
    schema = databases.database(service).schema
    with databases.connect(service) as conn:
        rows = conn.execute(render(_RECENT, schema), (limit,)).fetchall()
    return [RecordedAction(*row) for row in rows]


def _letters(conn: psycopg.Connection[Any], schema: str, where: DeadLetterFilter) -> list[Any]:
    letters = DeadLetterStore(schema).find(conn, where)
    if where.ids is not None:
        missing = sorted(set(where.ids) - {letter.id for letter in letters})
        if missing:
            raise DeadLetterNotFound(f"no such dead letters (or not pending): {missing}")
    return letters


def replay_letters(
    databases: Databases, service: str, where: DeadLetterFilter, actor: Actor
) -> str:
    """Replay the letters ``where`` selects (superseded ones are refused); recorded."""
    schema = databases.database(service).schema
    target = {"service": service, **where.describe()}
    with databases.connect(service) as conn:
        letters = _letters(conn, schema, where)
        criteria = {**target, "command": "saga dashboard", "operator": actor.operator}
        result = replay(conn, letters, criteria, schema=schema)
        summary = f"replayed {len(result.replayed)} dead letter(s)" + (
            f", refused {len(result.refused)}: "
            + "; ".join(f"{i}: {why}" for i, why in result.refused.items())
            if result.refused
            else ""
        )
        record(conn, schema, actor, "replay", target, summary)
    return summary


def purge_letters(databases: Databases, service: str, where: DeadLetterFilter, actor: Actor) -> str:
    """Purge the letters ``where`` selects (a held saga then compensates); recorded."""
    schema = databases.database(service).schema
    target = {"service": service, **where.describe()}
    with databases.connect(service) as conn:
        letters = _letters(conn, schema, where)
        summary = f"purged {purge(conn, letters, schema=schema)} dead letter(s)"
        record(conn, schema, actor, "purge", target, summary)
    return summary


def cancel_saga(databases: Databases, service: str, saga_id: UUID, actor: Actor) -> str:
    """Ask a running saga to compensate (refused past its pivot); recorded."""
    schema = databases.database(service).schema
    target = {"service": service, "saga_id": str(saga_id)}
    with databases.connect(service) as conn, conn.transaction():
        request_cancel(SagaStore(schema), conn, saga_id, f"dashboard: {actor.operator}")
        summary = f"saga {saga_id} will compensate as soon as its pending step answers"
        record(conn, schema, actor, "cancel", target, summary)
    return summary


def resume_saga(databases: Databases, service: str, saga_id: UUID, actor: Actor) -> str:
    """Send a saga a resume (as ``saga resume ID``, whatever its idle time); recorded."""
    schema = databases.database(service).schema
    target = {"service": service, "saga_id": str(saga_id)}
    with databases.connect(service) as conn, conn.transaction():
        home = SagaResumer(schema).resume(
            conn, saga_id, stuck_after=RESUME_ANY_IDLE, reason=f"dashboard: {actor.operator}"
        )
        summary = f"resume of saga {saga_id} sent to {home!r}"
        record(conn, schema, actor, "resume", target, summary)
    return summary
