"""Publishing on the PostgreSQL broker: a batch of messages in one INSERT, exchanges
routed inside it from bindings kept as rows.

A producer's batch (``Producer.batch()``) collects messages and writes them in one
multi-row INSERT per flush. kombu's virtual transports keep bindings in the memory of
one process; the PostgreSQL broker keeps them in ``<schema>.subscriptions``
(``exchange``, ``routing_key``, ``queue``), so every publisher sees every subscriber's
binding and a restart forgets none. A publish to an exchange becomes one message row
per bound queue in the same statement that writes it (one snapshot: a binding made
meanwhile applies to the whole message or not at all); the statement also says which
messages nothing routed, for the producer's ``on_return`` callback.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from psycopg import sql

from saga.broker.bindings import Binding
from saga.db.sql import Tx

SUBSCRIPTIONS_DDL = """
CREATE TABLE IF NOT EXISTS {subscriptions} (
    exchange text NOT NULL,
    routing_key text NOT NULL,
    queue text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (exchange, routing_key, queue)
);
"""

#: Messages for queues named by their routing keys (no exchange): the plain insert, into
#: the current generation (:mod:`saga.broker.postgres.rotation`).
_INSERT = """
INSERT INTO {messages} (generation, queue, body, headers, properties, visible_at)
SELECT r.generation, k, b, h::jsonb, p::jsonb, now() + d * interval '1 second'
FROM {ring} r,
     unnest(%b::text[], %b::text[], %b::bytea[], %b::text[], %b::text[], %b::float8[])
     AS m(x, k, b, h, p, d)
"""

#: The messages of one flush, each with its exchange ('' for the queue its routing key
#: names) and routing key; a message sent to an exchange becomes a row per bound queue.
#: Returns the queues written to and the (1-based) positions of the messages unrouted.
_ROUTED_INSERT = """
WITH m AS (
    SELECT * FROM unnest(%b::text[], %b::text[], %b::bytea[], %b::text[], %b::text[],
                         %b::float8[]) WITH ORDINALITY AS m(x, k, b, h, p, d, n)
), routed AS (
    SELECT m.n, CASE WHEN m.x = '' THEN m.k ELSE s.queue END AS queue, m.b, m.h, m.p, m.d
    FROM m LEFT JOIN {subscriptions} s ON m.x <> '' AND s.exchange = m.x AND s.routing_key = m.k
), inserted AS (
    INSERT INTO {messages} (generation, queue, body, headers, properties, visible_at)
    SELECT r.generation, queue, b, h::jsonb, p::jsonb, now() + d * interval '1 second'
    FROM {ring} r, routed WHERE queue IS NOT NULL ORDER BY n, queue
    RETURNING queue
)
SELECT ARRAY(SELECT DISTINCT queue FROM inserted),
       ARRAY(SELECT n FROM routed WHERE queue IS NULL ORDER BY n)
"""

_BIND = "INSERT INTO {} (exchange, routing_key, queue) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
_UNBIND = "DELETE FROM {} WHERE exchange = %s AND routing_key = %s AND queue = %s"
_UNBIND_QUEUE = "DELETE FROM {} WHERE queue = %s"
_BINDINGS = "SELECT exchange, routing_key, queue, created_at FROM {} ORDER BY 1, 2, 3"

#: The exchange of a binding declared without one (kombu's default for direct exchanges).
DEFAULT_EXCHANGE = "amq.direct"

#: One message to insert: (exchange, routing key, kombu's message dict). An empty
#: exchange sends it to the queue the routing key names.
Outgoing = tuple[str, str, dict[str, Any]]

#: The statements' columns: exchanges, routing keys, bodies, headers, properties, delays.
Columns = tuple[list[str], list[str], list[bytes], list[str], list[str], list[float]]


class Publishing(Protocol):
    """The channel a publish batch goes through."""

    def basic_publish(self, message: dict[str, Any], **kwargs: Any) -> Any: ...

    def insert(self, rows: Sequence[Outgoing]) -> None: ...


class PublishBatch:
    """A producer's batch (``Producer.batch()``): one multi-row INSERT per flush."""

    def __init__(self, channel: Publishing, max_size: int) -> None:
        self.channel = channel
        self.max_size = max_size
        self._rows: list[Outgoing] = []

    def publish(self, message: dict[str, Any], **kwargs: Any) -> Any:
        return self.channel.basic_publish(message, _publish_batch=self, **kwargs)

    def add(self, row: Outgoing) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.max_size:
            self.flush()

    def flush(self) -> None:
        rows, self._rows = self._rows, []
        if rows:
            self.channel.insert(rows)

    def discard(self) -> None:
        self._rows = []

    def close(self) -> None:
        self._rows = []


def columns_of(rows: Sequence[Outgoing]) -> Columns:
    """The statements' columns for ``rows``: kombu's message dicts as table values (an
    ``x-delay`` header, in milliseconds, delays the message)."""
    columns: Columns = ([], [], [], [], [], [])
    exchanges, keys, bodies, headers, properties, delays = columns
    for exchange, routing_key, message in rows:
        body = message["body"]
        props = dict(message.get("properties") or {})
        props["content-type"] = message.get("content-type")
        props["content-encoding"] = message.get("content-encoding")
        head = message.get("headers") or {}
        exchanges.append(exchange)
        keys.append(routing_key)
        bodies.append(body if isinstance(body, bytes) else str(body).encode("utf-8"))
        headers.append(json.dumps(head))
        properties.append(json.dumps(props))
        delays.append(float(head.get("x-delay") or 0) / 1000.0)
    return columns


@dataclass(frozen=True, slots=True)
class ReturnedMessage:
    """A message no binding routed, as ``on_return`` callbacks receive it."""

    properties: dict[str, Any]
    body: bytes


class Bindings:
    """The bindings of one broker schema, on a connection in autocommit."""

    def __init__(self, schema: str) -> None:
        self.table = sql.Identifier(schema, "subscriptions")
        messages = sql.Identifier(schema, "messages")
        ring = sql.Identifier(schema, "ring")
        self._insert = sql.SQL(_INSERT).format(messages=messages, ring=ring)
        self._routed_insert = sql.SQL(_ROUTED_INSERT).format(
            messages=messages, ring=ring, subscriptions=self.table
        )

    def bind(
        self, db: psycopg.Connection[Any], exchange: str, routing_key: str, queue: str
    ) -> None:
        db.execute(sql.SQL(_BIND).format(self.table), (exchange, routing_key, queue))

    def unbind(
        self, db: psycopg.Connection[Any], exchange: str, routing_key: str, queue: str
    ) -> None:
        db.execute(sql.SQL(_UNBIND).format(self.table), (exchange, routing_key, queue))

    def unbind_queue(self, db: psycopg.Connection[Any], queue: str) -> None:
        """Remove every binding of ``queue`` (the queue is deleted)."""
        db.execute(sql.SQL(_UNBIND_QUEUE).format(self.table), (queue,))

    def all(self, db: psycopg.Connection[Any]) -> list[Binding]:
        return [Binding(*row) for row in db.execute(sql.SQL(_BINDINGS).format(self.table))]

    def insert(self, db: psycopg.Connection[Any], columns: Columns) -> tuple[list[str], list[int]]:
        """Insert the messages of ``columns`` in one statement; return the queues written to
        and the 0-based positions of the messages sent to an exchange that no binding routed."""
        exchanges, keys = columns[0], columns[1]
        if not any(exchanges):  # commands only: no routing to do
            db.execute(self._insert, columns)
            return keys, []
        row = db.execute(self._routed_insert, columns).fetchone()
        assert row is not None
        queues, unrouted = row
        return list(queues), [n - 1 for n in unrouted]


def broker_bindings(tx: Tx, schema: str) -> list[Binding]:
    """The bindings of the PostgreSQL broker whose tables are in ``schema`` (none before its
    first connection created them)."""
    found = tx.execute("SELECT to_regclass(%s)", (f"{schema}.subscriptions",)).fetchone()
    if not (found and found[0]):
        return []
    return Bindings(schema).all(tx)
