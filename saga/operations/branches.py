"""Which steps of a saga are branches of a parallel group, read from its definition's
recorded shape (``saga_definitions``), so that tools loading no saga code can draw them."""

from __future__ import annotations

from typing import Any

import psycopg

from saga.engine.store import SagaStore


def branches(conn: psycopg.Connection[Any], schema: str, name: str, version: int) -> dict[str, str]:
    """Each member step of a parallel group -> the group, for saga ``name`` at ``version``
    (empty when that version's shape is not recorded, or it has no group)."""
    shape = SagaStore(schema).recorded_definitions(conn, [name]).get((name, version), [])
    return {member["step"]: step["step"] for step in shape for member in step.get("members", ())}
