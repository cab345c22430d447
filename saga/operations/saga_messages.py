"""The messages of one saga found in one service's database: the replies its
participants sent (kept with their inbox), what waits in the outbox, and its dead
letters. A saga's page gathers them from every service's database."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from saga.db.sql import Tx, render
from saga.messaging.dead_letters import DeadLetterFilter, DeadLetterRow, DeadLetterStore

_REPLIES = """
SELECT consumer, message_id, reply_id, destination, message_type, sent_at
FROM {schema}.inbox_replies WHERE saga_id = %s ORDER BY sent_at, reply_id
"""

#: Not a row its writer still holds under a live lease: that one waits for nothing (its
#: writer publishes it right after its commit, and deletes it a little later).
_PENDING = """
SELECT message_id, destination, message_type, created_at, deliver_after, attempts, last_error
FROM {schema}.outbox
WHERE saga_id = %s AND NOT (leased AND deliver_after > statement_timestamp())
ORDER BY id
"""

_RECEIVED = """
SELECT message_id, received_at FROM {schema}.inbox
WHERE consumer = %s AND message_id = ANY(%b::uuid[])
"""


@dataclass(frozen=True, slots=True)
class SentReply:
    """A reply a participant (``consumer``) sent for the command ``message_id``."""

    consumer: str
    message_id: UUID
    reply_id: UUID
    destination: str
    message_type: str
    sent_at: datetime


@dataclass(frozen=True, slots=True)
class PendingMessage:
    """A message of the saga waiting in the outbox: for the relays, or for its time (not
    one its writer holds under a live lease)."""

    message_id: UUID
    destination: str
    message_type: str
    created_at: datetime
    deliver_after: datetime | None
    attempts: int
    last_error: str | None


@dataclass(slots=True)
class SagaMessages:
    """What one database knows of one saga's messages."""

    replies: list[SentReply] = field(default_factory=list)
    pending: list[PendingMessage] = field(default_factory=list)
    dead_letters: list[DeadLetterRow] = field(default_factory=list)


def saga_messages(tx: Tx, schema: str, saga_id: UUID) -> SagaMessages:
    """The replies, outbox rows and dead letters of ``saga_id`` in this database."""
    replies = tx.execute(render(_REPLIES, schema), (saga_id,)).fetchall()
    pending = tx.execute(render(_PENDING, schema), (saga_id,)).fetchall()
    letters = DeadLetterStore(schema).find(tx, DeadLetterFilter(saga_id=saga_id, status=None))
    return SagaMessages(
        [SentReply(*row) for row in replies], [PendingMessage(*row) for row in pending], letters
    )


def received_at(
    tx: Tx, schema: str, consumer: str, message_ids: Sequence[UUID]
) -> dict[UUID, datetime]:
    """When ``consumer`` (a saga's home service) took each of ``message_ids`` in."""
    if not message_ids:
        return {}
    rows = tx.execute(render(_RECEIVED, schema), (consumer, list(message_ids))).fetchall()
    return dict(rows)
