"""What a service database records about events (publish/subscribe).

- ``subscriptions``: each consumer service writes the bindings it declared, with the
  broker and queue, every time a worker connects (``saga subscriptions`` reads them;
  ``first_declared_at`` is when the service started receiving that event). What it
  recorded before and no longer subscribes to is how a worker knows which bindings to
  remove.
- ``events_unrouted``: the events a relay (or a consumer publishing its own rows)
  published that reached no subscriber. Not an error: they are dropped, and counted
  here per event type for ``saga stats``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from saga.db.sql import Tx, render

_RECORD_SUBSCRIPTIONS = """
INSERT INTO {schema}.subscriptions (consumer, message_type, broker, queue)
SELECT %s, unnest(%b::text[]), %s, %s
ON CONFLICT (consumer, message_type, broker, queue) DO UPDATE SET last_declared_at = now()
"""

#: The subscriptions a consumer recorded on this broker and queue that it no longer has.
_FORGET_OTHERS = """
DELETE FROM {schema}.subscriptions
WHERE consumer = %s AND broker = %s AND queue = %s AND NOT (message_type = ANY(%b::text[]))
RETURNING message_type
"""

_SUBSCRIPTIONS = """
SELECT consumer, message_type, broker, queue, first_declared_at, last_declared_at
FROM {schema}.subscriptions ORDER BY consumer, message_type, broker, queue
"""

_COUNT_UNROUTED = """
INSERT INTO {schema}.events_unrouted (message_type, events)
SELECT * FROM unnest(%b::text[], %b::bigint[])
ON CONFLICT (message_type) DO UPDATE
SET events = events_unrouted.events + excluded.events, last_at = now()
"""

_UNROUTED = """
SELECT message_type, events, first_at, last_at FROM {schema}.events_unrouted
ORDER BY message_type
"""


@dataclass(frozen=True, slots=True)
class Subscription:
    """A consumer service's binding to one event type, as it recorded it."""

    consumer: str
    message_type: str
    broker: str
    queue: str
    first_declared_at: datetime
    last_declared_at: datetime


@dataclass(frozen=True, slots=True)
class UnroutedEvents:
    """Events of one type published with no subscriber."""

    message_type: str
    events: int
    first_at: datetime
    last_at: datetime


class EventRecords:
    """The event bookkeeping of one schema, on connections the caller manages."""

    def __init__(self, schema: str) -> None:
        self._record = render(_RECORD_SUBSCRIPTIONS, schema)
        self._forget_others = render(_FORGET_OTHERS, schema)
        self._subscriptions = render(_SUBSCRIPTIONS, schema)
        self._count_unrouted = render(_COUNT_UNROUTED, schema)
        self._unrouted = render(_UNROUTED, schema)

    def replace_subscriptions(
        self,
        tx: Tx,
        consumer: str,
        message_types: Sequence[str],
        broker: str,
        queue: str,
    ) -> list[str]:
        """Record that ``consumer``'s ``queue`` on ``broker`` (a URL without its password) is
        bound to ``message_types`` now, forgetting what it recorded there beyond them (the
        subscriptions its code no longer has); return the event types forgotten."""
        params = (consumer, broker, queue, list(message_types))
        dropped = sorted(row[0] for row in tx.execute(self._forget_others, params))
        if message_types:
            tx.execute(self._record, (consumer, list(message_types), broker, queue))
        return dropped

    def subscriptions(self, tx: Tx) -> list[Subscription]:
        return [Subscription(*row) for row in tx.execute(self._subscriptions)]

    def count_unrouted(self, tx: Tx, message_types: Sequence[str]) -> None:
        """Add one unrouted event per item of ``message_types`` (in one statement)."""
        if message_types:
            tx.execute(*self.unrouted_counted(message_types))

    def unrouted_counted(self, message_types: Sequence[str]) -> tuple[str, list[object]]:
        """The statement (and its parameters) that adds one unrouted event per item of
        ``message_types``, to run alone or as a writable CTE of a larger one."""
        counts = Counter(message_types)
        return self._count_unrouted, [list(counts), list(counts.values())]

    def unrouted(self, tx: Tx) -> list[UnroutedEvents]:
        return [UnroutedEvents(*row) for row in tx.execute(self._unrouted)]
