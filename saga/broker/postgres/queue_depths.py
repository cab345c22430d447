"""The queues of a PostgreSQL broker, read from its ``messages`` table: messages by state
and the age of the oldest."""

from __future__ import annotations

from saga.broker.queue_depths import QueueDepth
from saga.db.sql import Tx, render

_QUEUE_DEPTHS = """
SELECT queue,
       count(*),
       count(*) FILTER (WHERE visible_at <= now()),
       count(*) FILTER (WHERE visible_at > now() AND lock_token IS NOT NULL),
       count(*) FILTER (WHERE visible_at > now() AND lock_token IS NULL),
       extract(epoch FROM now() - min(enqueued_at))
FROM {schema}.messages GROUP BY queue ORDER BY queue
"""


def table_queue_depths(tx: Tx, schema: str) -> dict[str, QueueDepth]:
    """Every queue of the PostgreSQL broker whose table is in ``schema`` (none before its
    first connection created it). ``in_flight``: taken, under a lease; ``delayed``: not
    yet due (a retry's delay or a released lease)."""
    found = tx.execute("SELECT to_regclass(%s)", (f"{schema}.messages",)).fetchone()
    if not (found and found[0]):
        return {}
    return {
        queue: QueueDepth(
            ready=ready, depth=depth, in_flight=in_flight, delayed=delayed, oldest_age_s=float(age)
        )
        for queue, depth, ready, in_flight, delayed, age in tx.execute(
            render(_QUEUE_DEPTHS, schema)
        )
    }
