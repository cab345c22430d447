"""Figures about sagas for ``saga stats`` (counts, durations, oldest, stuck), and the
queues of a PostgreSQL broker (depth, oldest message's age)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg

from saga.db.sql import render
from saga.observability.broker_queues import BrokerQueue, broker_queues

__all__ = ["BrokerQueue", "SagaStats", "broker_queues", "collect"]

_COUNTS = "SELECT name, status, count(*) FROM {schema}.saga_instances GROUP BY 1, 2 ORDER BY 1, 2"

_DURATIONS = """
SELECT name,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)),
       count(*)
FROM {schema}.saga_instances
WHERE status IN ('completed', 'compensated') AND finished_at >= now() - %s::interval
GROUP BY name ORDER BY name
"""

_OLDEST = """
SELECT name, min(started_at) FROM {schema}.saga_instances
WHERE status IN ('running', 'compensating') GROUP BY name ORDER BY name
"""

_STUCK = """
SELECT id, name, status, step, updated_at FROM {schema}.saga_instances
WHERE status IN ('running', 'compensating') AND updated_at < now() - %s::interval
ORDER BY updated_at LIMIT %s
"""

_STUCK_COUNT = """
SELECT count(*) FROM {schema}.saga_instances
WHERE status IN ('running', 'compensating') AND updated_at < now() - %s::interval
"""


@dataclass
class SagaStats:
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    durations: dict[str, dict[str, float]] = field(default_factory=dict)
    oldest_running: dict[str, datetime] = field(default_factory=dict)
    stuck_count: int = 0
    stuck: list[dict[str, Any]] = field(default_factory=list)


def collect(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    window: timedelta,
    stuck_after: timedelta,
    stuck_limit: int = 20,
) -> SagaStats:
    stats = SagaStats()
    for name, status, count in conn.execute(render(_COUNTS, schema)):
        stats.counts.setdefault(name, {})[status] = count
    for name, p50, p95, count in conn.execute(render(_DURATIONS, schema), (window,)):
        stats.durations[name] = {"p50_s": float(p50), "p95_s": float(p95), "finished": count}
    for name, started in conn.execute(render(_OLDEST, schema)):
        stats.oldest_running[name] = started
    row = conn.execute(render(_STUCK_COUNT, schema), (stuck_after,)).fetchone()
    stats.stuck_count = int(row[0]) if row else 0
    for saga_id, name, status, step, updated in conn.execute(
        render(_STUCK, schema), (stuck_after, stuck_limit)
    ):
        stats.stuck.append(
            {"id": saga_id, "name": name, "status": status, "step": step, "updated_at": updated}
        )
    return stats
