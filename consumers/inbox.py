"""The inbox: one row per (consumer, message id) processed, written in the handler's transaction.

With it, the replies the handler sent (``inbox_replies``): a duplicate of a message
already handled is answered again with them, under their original message ids. A
saga resumed because a broker lost the reply then gets its answer, and a reply that
was not lost after all arrives twice and is skipped by the saga's own inbox.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

from saga.db.sql import Tx, render
from saga.handlers.closed_steps import LOCK_SEED
from saga.messaging.leases import Leases
from saga.messaging.outbox import OutgoingMessage

#: A delivery's opening, in one statement: the inbox rows, then the shared step-key locks of
#: the new forward commands and which of their steps are closed (a function of the schema:
#: it reads in a snapshot taken after the locks are granted; see 0017_lone_delivery.sql).
#: Rows of (message id, None, None) for each message not processed before, (None, step
#: key, None) for each closed step, (None, None, document) for each row a service reads.
#: A batch sends its ids and keys as arrays; a delivery alone sends plain values (dumping
#: arrays costs the client more than the statement). Writable CTEs of the caller's may
#: come before it (:meth:`Inbox.opening`'s ``before``).
_OPEN = """
fresh AS (
    INSERT INTO {{schema}}.inbox (consumer, message_id)
    {rows}
    ON CONFLICT DO NOTHING
    RETURNING message_id
)
SELECT message_id, NULL::text, NULL::jsonb FROM fresh
UNION ALL
SELECT NULL::uuid, closed, NULL::jsonb
FROM {{schema}}.closed_steps_locked(ARRAY({keys}), %s) AS closed
"""

#: Rows the service's handlers will need, read in the same statement (after the rest).
_READ = "\nUNION ALL\nSELECT NULL::uuid, NULL::text, document FROM (%s) AS read(document)"

#: Parameters: consumer, ids, ids, step keys, lock seed.
_OPEN_MANY = _OPEN.format(
    rows="SELECT %s, unnest(%b::uuid[])",
    keys="""
        SELECT d.step_key FROM unnest(%b::uuid[], %b::text[]) AS d(message_id, step_key)
        JOIN fresh USING (message_id)
        WHERE d.step_key IS NOT NULL""",
)

#: Parameters: consumer, id, step key, step key, lock seed.
_OPEN_ONE = _OPEN.format(
    rows="VALUES (%s, %s)",
    keys="SELECT %s::text FROM fresh WHERE %s::text IS NOT NULL",
)

_FORGET = "DELETE FROM {schema}.inbox WHERE consumer = %s AND message_id = %s"

_KEEP_REPLIES = """
INSERT INTO {schema}.inbox_replies
    (consumer, message_id, reply_id, destination, message_type, saga_id, body)
SELECT %s, * FROM unnest(%b::uuid[], %b::uuid[], %b::text[], %b::text[], %b::uuid[], %b::bytea[])
ON CONFLICT DO NOTHING
"""

_KEEP_REPLY = """
INSERT INTO {schema}.inbox_replies
    (consumer, message_id, reply_id, destination, message_type, saga_id, body)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING
"""

#: Leased to the consumer (:mod:`saga.messaging.leases`) when given a lease, else ready
#: for the relays at once (``now() + NULL`` is NULL).
_ANSWER_AGAIN = """
INSERT INTO {schema}.outbox
    (message_id, destination, message_type, saga_id, body, deliver_after, leased)
SELECT reply_id, destination, message_type, saga_id, body, lease.until, lease.until IS NOT NULL
FROM {schema}.inbox_replies, (SELECT statement_timestamp() + %s::interval AS until) AS lease
WHERE consumer = %s AND message_id = ANY(%b::uuid[])
RETURNING id, message_id, destination, message_type, body
"""


class Inbox:
    """Deduplication records, and the replies kept with them, on one schema."""

    def __init__(self, schema: str) -> None:
        self._open_many = render(_OPEN_MANY, schema)
        self._open_one = render(_OPEN_ONE, schema)
        self._forget = render(_FORGET, schema)
        self._keep_replies = render(_KEEP_REPLIES, schema)
        self._keep_reply = render(_KEEP_REPLY, schema)
        self._answer_again = render(_ANSWER_AGAIN, schema)

    def opening(
        self,
        consumer: str,
        message_ids: list[UUID],
        step_keys: list[str | None],
        before: tuple[Sequence[str], Sequence[Any]] = ((), ()),
        reading: tuple[str, Sequence[Any]] | None = None,
    ) -> tuple[str, list[Any]]:
        """The statement (and its parameters) inserting the inbox rows of ``message_ids``
        (each with its forward command's step key, or None) and holding those keys' shared
        locks; :meth:`opened` reads what it returns. ``before``: writable CTEs (and their
        parameters) the statement runs too; ``reading``: a query of one jsonb column (and
        its parameters) whose documents it returns as well."""
        ctes, values = before
        if len(message_ids) == 1:
            query = self._open_one
            key = step_keys[0]
            params = [*values, consumer, message_ids[0], key, key, LOCK_SEED]
        else:
            query = self._open_many
            params = [*values, consumer, message_ids, message_ids, step_keys, LOCK_SEED]
        statement = "WITH " + ",\n".join([*ctes, query])
        if reading is not None:
            read_query, read_values = reading
            statement += _READ.replace("%s", read_query)
            params += read_values
        return statement, params

    @staticmethod
    def opened(rows: Iterable[tuple[Any, ...]]) -> tuple[set[UUID], set[str], list[Any]]:
        """What an :meth:`opening` statement returned: the ids this consumer had not
        processed, the step keys among theirs whose steps were closed, and the documents
        its ``reading`` read."""
        fresh: set[UUID] = set()
        closed: set[str] = set()
        documents: list[Any] = []
        for message_id, key, document in rows:
            if message_id is not None:
                fresh.add(message_id)
            elif key is not None:
                closed.add(key)
            else:
                documents.append(document)
        return fresh, closed, documents

    def forget(self, tx: Tx, consumer: str, message_id: UUID) -> None:
        """Drop the row of a message that was not processed after all (retried or dead-lettered)."""
        tx.execute(self._forget, (consumer, message_id))

    def replies_kept(
        self,
        consumer: str,
        replies: Sequence[tuple[UUID, OutgoingMessage]],
        bodies: Mapping[UUID, bytes],
    ) -> tuple[str, list[Any]]:
        """The statement keeping each (handled message id, reply it caused), and its
        parameters (:mod:`saga.consumers.closing` runs it with the batch's outbox rows).
        ``bodies`` has the serialized replies already at hand, by message id."""
        rows = [
            (
                message_id,
                reply.envelope.message_id,
                reply.destination,
                reply.envelope.type,
                reply.envelope.saga_id,
                bodies.get(reply.envelope.message_id) or reply.envelope.to_bytes(),
            )
            for message_id, reply in replies
        ]
        if len(rows) == 1:
            return self._keep_reply, [consumer, *rows[0]]
        return self._keep_replies, [consumer, *(list(column) for column in zip(*rows, strict=True))]

    def answer_again(
        self,
        tx: Tx,
        consumer: str,
        message_ids: list[UUID],
        leases: Leases | None,
    ) -> list[int]:
        """Write the kept replies to these (duplicate) messages to the outbox again, under
        their original message ids, leased to ``leases`` if given; return the new row ids."""
        lease = None if leases is None else leases.lease
        cur = tx.execute(self._answer_again, (lease, consumer, message_ids), prepare=True)
        returned = cur.fetchall()
        return [row[0] for row in returned] if leases is None else leases.add_written(returned)
