"""The inbox: one row per (consumer, message id) processed, written in the handler's transaction."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg

from saga.identifiers import render

_RECORD = """
INSERT INTO {schema}.inbox (consumer, message_id) VALUES (%s, %s)
ON CONFLICT DO NOTHING
"""


class Inbox:
    """Deduplication records on one schema."""

    def __init__(self, schema: str) -> None:
        self._record = render(_RECORD, schema)

    def record(self, conn: psycopg.Connection[Any], consumer: str, message_id: UUID) -> bool:
        """Insert the inbox row; False if this consumer already processed ``message_id``."""
        cur = conn.execute(self._record, (consumer, message_id), prepare=True)
        return cur.rowcount == 1
