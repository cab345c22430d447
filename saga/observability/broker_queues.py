"""The queues of a PostgreSQL broker (``saga stats`` and the Prometheus gauges): messages
by state and the age of the oldest, read from the broker's ``messages`` table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from saga.db.sql import render

_BROKER_QUEUES = """
SELECT queue,
       count(*),
       count(*) FILTER (WHERE visible_at <= now()),
       count(*) FILTER (WHERE visible_at > now() AND lock_token IS NOT NULL),
       count(*) FILTER (WHERE visible_at > now() AND lock_token IS NULL),
       extract(epoch FROM now() - min(enqueued_at))
FROM {schema}.messages GROUP BY queue ORDER BY queue
"""


@dataclass(frozen=True, slots=True)
class BrokerQueue:
    """One queue of a PostgreSQL broker: its messages by state, and how old the oldest is."""

    depth: int
    ready: int
    in_flight: int
    delayed: int
    oldest_age_s: float


def broker_queues(conn: psycopg.Connection[Any], schema: str) -> dict[str, BrokerQueue]:
    """The queues of the PostgreSQL broker whose table is in ``schema`` (none before its
    first connection created it). ``in_flight``: taken, under a lease; ``delayed``: not
    yet due (a retry's delay or a released lease)."""
    found = conn.execute("SELECT to_regclass(%s)", (f"{schema}.messages",)).fetchone()
    if not (found and found[0]):
        return {}
    return {
        queue: BrokerQueue(depth, ready, in_flight, delayed, float(age))
        for queue, depth, ready, in_flight, delayed, age in conn.execute(
            render(_BROKER_QUEUES, schema)
        )
    }
