"""The outbox writer: messages written in the caller's own transaction.

``Outbox.add`` inserts one row on the connection it is given and never
commits; the message leaves only if the caller's transaction commits. The
relay (``saga relay``) later publishes the row and deletes it.
``Outbox.add_async`` is the same write on a ``psycopg.AsyncConnection``.
``Outbox.publish`` (and ``publish_async``) writes an event: a row with no
destination, which the relay publishes to every service subscribing to its type.
Inside a consumer's transaction the rows for now are leased to the consumer instead,
which publishes them itself right after its commit (:mod:`saga.messaging.leases`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple
from uuid import UUID

from pydantic import BaseModel

from saga.db.sql import AsyncTx, Tx, render, validate_name, validate_schema
from saga.errors import ConfigurationError, MessageTooLarge
from saga.messaging.envelope import Envelope
from saga.messaging.leases import Leases, active_leases

DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024

_INSERT = """
INSERT INTO {schema}.outbox
    (message_id, destination, message_type, saga_id, body, deliver_after)
VALUES (%s, %s, %s, %s, %s, COALESCE(%s::timestamptz, now() + %s::interval))
"""

#: Many rows in one statement: each column travels as one array.
_INSERT_MANY = """
INSERT INTO {schema}.outbox
    (message_id, destination, message_type, saga_id, body, deliver_after)
SELECT message_id, destination, message_type, saga_id, body,
       COALESCE(deliver_at, now() + delay)
FROM unnest(%b::uuid[], %b::text[], %b::text[], %b::uuid[], %b::bytea[], %b::timestamptz[],
            %b::interval[]) AS v(message_id, destination, message_type, saga_id, body, deliver_at,
                                 delay)
"""

_RETURNING_ID = "RETURNING id"

#: The same, with the relays' wake-up riding on the insert: an uncorrelated subquery runs
#: once, so the NOTIFY costs no statement of its own (its parameter: the channel).
_RETURNING_ID_WAKING = "RETURNING id, (SELECT pg_notify(%s, '')) IS NULL"

#: Rows leased to their writer (:mod:`saga.messaging.leases`): the relays leave them alone
#: until the lease ends; the insert hands back what publishing them takes.
_INSERT_LEASED = """
INSERT INTO {schema}.outbox
    (message_id, destination, message_type, saga_id, body, deliver_after, leased)
SELECT message_id, destination, message_type, saga_id, body, statement_timestamp() + %s::interval,
       true
FROM unnest(%b::uuid[], %b::text[], %b::text[], %b::uuid[], %b::bytea[])
    AS v(message_id, destination, message_type, saga_id, body)
RETURNING id, message_id, destination, message_type, body
"""

#: The same for one row, with plain values (dumping arrays costs the client more).
_INSERT_LEASED_ONE = """
INSERT INTO {schema}.outbox
    (message_id, destination, message_type, saga_id, body, deliver_after, leased)
VALUES (%s, %s, %s, %s, %s, statement_timestamp() + %s::interval, true)
RETURNING id, message_id, destination, message_type, body
"""

_WAKE = "SELECT pg_notify(%s, '')"

#: The end of an unleased insert, without and with the wake-up.
_RETURNING = ((False, _RETURNING_ID), (True, _RETURNING_ID_WAKING))


class NewOutboxRow(NamedTuple):
    """One outbox row about to be written, its values in the order of the insert statements."""

    message_id: UUID
    destination: str | None
    message_type: str
    saga_id: UUID | None
    body: bytes
    #: the instant it is held back until (``deliver_after`` as a datetime)
    deliver_at: datetime | None
    #: how long it is held back from the transaction's start (``deliver_after`` as a timedelta)
    delay: timedelta | None


Delay = datetime | timedelta | None


class EmbeddedInsert(NamedTuple):
    """An outbox insert to run inside a statement of the caller's
    (:meth:`Outbox.embedded_statement`). Leased, it returns the columns of
    :class:`~saga.messaging.leases.LeasedRow`; otherwise the row ids alone."""

    query: str
    params: list[Any]
    leased: bool


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One envelope bound for one destination (None: an event, for every subscriber of
    its type), ready to be inserted."""

    envelope: Envelope
    destination: str | None
    deliver_after: Delay = None

    @property
    def is_event(self) -> bool:
        return self.destination is None


def wake_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel on which relays of ``schema`` wait."""
    return f"{validate_schema(schema)}_outbox"


class Outbox:
    """Writes messages into the outbox table of one schema.

    ``max_message_bytes`` caps the serialized envelope; a larger message
    raises :class:`~saga.errors.MessageTooLarge` before anything is written.
    ``wake_interval`` debounces the wake-up hint sent to relays: at most one
    ``NOTIFY`` per interval from this object, so busy writers do not
    serialize on the notification lock; relays also poll.
    """

    def __init__(
        self,
        schema: str = "saga",
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        wake_interval: float = 0.1,
    ) -> None:
        self.schema = validate_schema(schema)
        if max_message_bytes <= 0:
            raise ValueError("max_message_bytes must be positive")
        self.max_message_bytes = max_message_bytes
        self.wake_interval = wake_interval
        self._insert = {
            wake: render(_INSERT, self.schema) + returning for wake, returning in _RETURNING
        }
        self._insert_many = {
            wake: render(_INSERT_MANY, self.schema) + returning for wake, returning in _RETURNING
        }
        self._insert_leased = render(_INSERT_LEASED, self.schema)
        self._insert_leased_one = render(_INSERT_LEASED_ONE, self.schema)
        self._channel = wake_channel(self.schema)
        self._last_wake = 0.0
        self._wake_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Outbox(schema={self.schema!r}, max_message_bytes={self.max_message_bytes})"

    def envelope(
        self,
        message: BaseModel,
        *,
        saga_id: UUID | None = None,
        correlation_id: UUID | None = None,
        causation_id: UUID | None = None,
        reply_to: str | None = None,
        headers: dict[str, str] | None = None,
        message_id: UUID | None = None,
    ) -> Envelope:
        """Wrap ``message`` in a new envelope (its ``message_id`` is fixed here)."""
        return Envelope.wrap(
            message,
            message_id=message_id,
            saga_id=saga_id,
            correlation_id=correlation_id,
            causation_id=causation_id,
            reply_to=reply_to,
            headers=headers,
        )

    def add(
        self,
        tx: Tx,
        message: BaseModel | Envelope,
        *,
        destination: str,
        deliver_after: Delay = None,
        **envelope_fields: Any,
    ) -> UUID:
        """Insert ``message`` for ``destination`` in the caller's transaction.

        ``message`` is a pydantic model (wrapped in a new envelope, see
        :meth:`envelope` for the keyword fields) or a ready envelope.
        ``deliver_after`` (a datetime, or a delay from the transaction's
        start) holds the message back until then. Returns the message id.
        On a :class:`psycopg.AsyncConnection`, use :meth:`add_async`.
        """
        return self._write(tx, message, destination, deliver_after, envelope_fields)

    async def add_async(
        self,
        tx: AsyncTx,
        message: BaseModel | Envelope,
        *,
        destination: str,
        deliver_after: Delay = None,
        **envelope_fields: Any,
    ) -> UUID:
        """:meth:`add` on an :class:`psycopg.AsyncConnection`: the same row, the same rules."""
        return await self._write_async(tx, message, destination, deliver_after, envelope_fields)

    def publish(
        self,
        tx: Tx,
        event: BaseModel | Envelope,
        *,
        deliver_after: Delay = None,
        **envelope_fields: Any,
    ) -> UUID:
        """Insert ``event`` in the caller's transaction, for every service that subscribes
        to its type (``@service.subscribe``); no destination. Returns the message id.

        Like :meth:`add`, it leaves only if the transaction commits. Each subscriber gets
        its own copy in its own queue; with no subscriber, the relay counts it as unrouted
        (``saga stats``) and drops it. On a :class:`psycopg.AsyncConnection`, use
        :meth:`publish_async`.
        """
        return self._write(tx, event, None, deliver_after, envelope_fields)

    async def publish_async(
        self,
        tx: AsyncTx,
        event: BaseModel | Envelope,
        *,
        deliver_after: Delay = None,
        **envelope_fields: Any,
    ) -> UUID:
        """:meth:`publish` on an :class:`psycopg.AsyncConnection`: the same row, the same rules."""
        return await self._write_async(tx, event, None, deliver_after, envelope_fields)

    def _write(
        self,
        tx: Tx,
        message: BaseModel | Envelope,
        destination: str | None,
        deliver_after: Delay,
        envelope_fields: dict[str, Any],
    ) -> UUID:
        outgoing = self._outgoing(message, destination, deliver_after, envelope_fields)
        self.add_many(tx, [outgoing])
        return outgoing.envelope.message_id

    async def _write_async(
        self,
        tx: AsyncTx,
        message: BaseModel | Envelope,
        destination: str | None,
        deliver_after: Delay,
        envelope_fields: dict[str, Any],
    ) -> UUID:
        outgoing = self._outgoing(message, destination, deliver_after, envelope_fields)
        await self.add_many_async(tx, [outgoing])
        return outgoing.envelope.message_id

    def add_many(self, tx: Tx, messages: Sequence[OutgoingMessage]) -> list[int]:
        """Insert several messages in one statement (same rules as :meth:`add`); return
        their outbox row ids. While :func:`~saga.messaging.leases.leasing`, the messages
        for now are leased to the writer (and a message held back is written apart)."""
        return self.insert_rows(tx, self.rows(messages))

    def rows(self, messages: Sequence[OutgoingMessage]) -> list[NewOutboxRow]:
        """The outbox rows of ``messages``, checked (destination, size) but not written yet
        (an event's row has no destination)."""
        return [self._params(m) for m in messages]

    def insert_rows(self, tx: Tx, rows: Sequence[NewOutboxRow]) -> list[int]:
        """Insert rows made by :meth:`rows`; return their ids."""
        leases = active_leases()
        ids: list[int] = []
        for query, params, leased in self._statements(rows, leases):
            returned = tx.execute(query, params, prepare=True).fetchall()
            ids += self._returned(returned, leases if leased else None)
        return ids

    def leased_insert(
        self, rows: Sequence[NewOutboxRow], lease: timedelta
    ) -> tuple[str, list[Any]]:
        """The statement inserting ``rows`` (none held back) leased for ``lease``, and its
        parameters; it returns :class:`~saga.messaging.leases.LeasedRow` columns."""
        if len(rows) == 1:
            return self._insert_leased_one, [*rows[0][:5], lease]
        columns = list(zip(*rows, strict=True))[:5]
        return self._insert_leased, [lease, *(list(column) for column in columns)]

    def embedded_statement(self, rows: Sequence[NewOutboxRow]) -> EmbeddedInsert | None:
        """The one statement writing ``rows`` (from :meth:`rows`) as :meth:`insert_rows`
        would, for a caller to run as part of a statement of its own and hand what it
        returned to :meth:`take_written`; None when there are none, or they take two
        statements (rows leased beside rows held back: :meth:`insert_rows` writes them)."""
        leases = active_leases()
        statements = self._statements(rows, leases)
        if len(statements) != 1:
            return None
        query, params, leased = statements[0]
        return EmbeddedInsert(query, list(params), leased)

    def take_written(self, statement: EmbeddedInsert, returned: Sequence[Any]) -> None:
        """What an :meth:`embedded_statement` returned: its rows leased to the active leases
        (unleased, the statement woke the relays itself)."""
        if statement.leased:
            self._returned(returned, active_leases())

    def written(self, tx: Tx, ids: Sequence[int]) -> None:
        """Announce outbox rows just written on ``tx`` by other means than :meth:`add`
        (never leased): a (debounced) wake-up for relays."""
        if ids and self._should_wake():
            tx.execute(_WAKE, (self._channel,))

    async def add_many_async(self, tx: AsyncTx, messages: Sequence[OutgoingMessage]) -> list[int]:
        """:meth:`add_many` on an :class:`psycopg.AsyncConnection`: the same statements."""
        leases = active_leases()
        ids: list[int] = []
        for query, params, leased in self._statements(self.rows(messages), leases):
            cur = await tx.execute(query, params, prepare=True)
            ids += self._returned(await cur.fetchall(), leases if leased else None)
        return ids

    def _outgoing(
        self,
        message: BaseModel | Envelope,
        destination: str | None,
        deliver_after: Delay,
        envelope_fields: dict[str, Any],
    ) -> OutgoingMessage:
        envelope = (
            message if isinstance(message, Envelope) else self.envelope(message, **envelope_fields)
        )
        return OutgoingMessage(envelope, destination, deliver_after)

    def _statements(
        self, rows: Sequence[NewOutboxRow], leases: Leases | None
    ) -> list[tuple[str, Sequence[Any], bool]]:
        """The inserts for ``rows``: (query, parameters, leased). Unleased: one statement, a
        plain prepared one for a single row (the usual case for an app's write), else one
        multi-row statement with a column per array; it wakes the relays (debounced: see
        :meth:`_should_wake`). Leased: the rows for now in one leased statement, those held
        back apart (they wait for their time, and wake nobody)."""
        if not rows:
            return []
        now = [] if leases is None else [r for r in rows if not held_back(r)]
        later = rows if leases is None else [r for r in rows if held_back(r)]
        statements: list[tuple[str, Sequence[Any], bool]] = []
        wake = leases is None and self._should_wake()
        woken = [self._channel] if wake else []
        if len(later) == 1:
            statements.append((self._insert[wake], [*later[0], *woken], False))
        elif later:
            columns = [list(column) for column in zip(*later, strict=True)]
            statements.append((self._insert_many[wake], [*columns, *woken], False))
        if now:
            assert leases is not None
            statements.append((*self.leased_insert(now, leases.lease), True))
        return statements

    def _returned(self, returned: Sequence[Sequence[Any]], leases: Leases | None) -> list[int]:
        """The ids an insert returned; rows it leased are handed to ``leases``."""
        if leases is None:
            return [row[0] for row in returned]
        return leases.add_written(returned)

    def _params(self, message: OutgoingMessage) -> NewOutboxRow:
        destination = message.destination
        if destination is not None:
            destination = validate_name(destination, "destination")
        body = message.envelope.to_bytes()
        if len(body) > self.max_message_bytes:
            raise MessageTooLarge(len(body), self.max_message_bytes, message.envelope.type)
        at = message.deliver_after if isinstance(message.deliver_after, datetime) else None
        if at is not None and at.utcoffset() is None:
            raise ConfigurationError(
                f"deliver_after {at.isoformat()} has no time zone: pass an aware datetime "
                "(an instant, read on the database's clock) or a timedelta (a delay from the "
                "transaction's start)"
            )
        delay = message.deliver_after if isinstance(message.deliver_after, timedelta) else None
        return NewOutboxRow(
            message.envelope.message_id,
            destination,
            message.envelope.type,
            message.envelope.saga_id,
            body,
            at,
            delay,
        )

    def _should_wake(self) -> bool:
        now = time.monotonic()
        with self._wake_lock:
            if now - self._last_wake < self.wake_interval:
                return False
            self._last_wake = now
            return True


def held_back(row: NewOutboxRow) -> bool:
    """Whether ``row`` waits for a ``deliver_after`` (an instant or a delay)."""
    return row.deliver_at is not None or row.delay is not None
