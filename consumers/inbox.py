"""The inbox: one row per (consumer, message id) processed, written in the handler's transaction."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg

from saga.db.sql import render

_RECORD = """
INSERT INTO {schema}.inbox (consumer, message_id)
SELECT %s, unnest(%s::uuid[])
ON CONFLICT DO NOTHING
RETURNING message_id
"""

_FORGET = "DELETE FROM {schema}.inbox WHERE consumer = %s AND message_id = %s"


class Inbox:
    """Deduplication records on one schema."""

    def __init__(self, schema: str) -> None:
        self._record = render(_RECORD, schema)
        self._forget = render(_FORGET, schema)

    def record(
        self, conn: psycopg.Connection[Any], consumer: str, message_ids: list[UUID]
    ) -> set[UUID]:
        """Insert inbox rows in one statement; return the ids this consumer had not processed."""
        cur = conn.execute(self._record, (consumer, message_ids), prepare=True)
        return {row[0] for row in cur.fetchall()}

    def forget(self, conn: psycopg.Connection[Any], consumer: str, message_id: UUID) -> None:
        """Drop the row of a message that was not processed after all (retried or dead-lettered)."""
        conn.execute(self._forget, (consumer, message_id))
