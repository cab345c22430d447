"""The inbox: one row per (consumer, message id) processed, written in the handler's transaction.

With it, the replies the handler sent (``inbox_replies``): a duplicate of a message
already handled is answered again with them, under their original message ids. A
saga resumed because a broker lost the reply then gets its answer, and a reply that
was not lost after all arrives twice and is skipped by the saga's own inbox.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

import psycopg

from saga.db.sql import render
from saga.messaging.outbox import OutgoingMessage

_RECORD = """
INSERT INTO {schema}.inbox (consumer, message_id)
SELECT %s, unnest(%b::uuid[])
ON CONFLICT DO NOTHING
RETURNING message_id
"""

_FORGET = "DELETE FROM {schema}.inbox WHERE consumer = %s AND message_id = %s"

_KEEP_REPLIES = """
INSERT INTO {schema}.inbox_replies
    (consumer, message_id, reply_id, destination, message_type, saga_id, body)
SELECT %s, * FROM unnest(%b::uuid[], %b::uuid[], %b::text[], %b::text[], %b::uuid[], %b::bytea[])
ON CONFLICT DO NOTHING
"""

_ANSWER_AGAIN = """
INSERT INTO {schema}.outbox (message_id, destination, message_type, saga_id, body)
SELECT reply_id, destination, message_type, saga_id, body FROM {schema}.inbox_replies
WHERE consumer = %s AND message_id = ANY(%b::uuid[])
RETURNING id
"""


class Inbox:
    """Deduplication records, and the replies kept with them, on one schema."""

    def __init__(self, schema: str) -> None:
        self._record = render(_RECORD, schema)
        self._forget = render(_FORGET, schema)
        self._keep_replies = render(_KEEP_REPLIES, schema)
        self._answer_again = render(_ANSWER_AGAIN, schema)

    def record(
        self, conn: psycopg.Connection[Any], consumer: str, message_ids: list[UUID]
    ) -> set[UUID]:
        """Insert inbox rows in one statement; return the ids this consumer had not processed."""
        cur = conn.execute(self._record, (consumer, message_ids), prepare=True)
        return {row[0] for row in cur.fetchall()}

    def forget(self, conn: psycopg.Connection[Any], consumer: str, message_id: UUID) -> None:
        """Drop the row of a message that was not processed after all (retried or dead-lettered)."""
        conn.execute(self._forget, (consumer, message_id))

    def keep_replies(
        self,
        conn: psycopg.Connection[Any],
        consumer: str,
        replies: Sequence[tuple[UUID, OutgoingMessage]],
    ) -> None:
        """Keep each (handled message id, reply it caused), all in one statement."""
        columns: tuple[list[Any], ...] = ([], [], [], [], [], [])
        for message_id, reply in replies:
            envelope = reply.envelope
            row = (
                message_id,
                envelope.message_id,
                reply.destination,
                envelope.type,
                envelope.saga_id,
                envelope.to_bytes(),
            )
            for column, value in zip(columns, row, strict=True):
                column.append(value)
        conn.execute(self._keep_replies, (consumer, *columns), prepare=True)

    def answer_again(
        self, conn: psycopg.Connection[Any], consumer: str, message_ids: list[UUID]
    ) -> list[int]:
        """Write the kept replies to these (duplicate) messages to the outbox again, under
        their original message ids; return the new outbox row ids."""
        cur = conn.execute(self._answer_again, (consumer, message_ids), prepare=True)
        return [row[0] for row in cur.fetchall()]
