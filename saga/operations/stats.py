"""Figures about sagas for ``saga stats`` and the dashboard's overview (counts, durations,
oldest, stuck, waiting, starts and ends per minute), the events published that no service
subscribes to."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from saga.db.sql import Tx, render
from saga.engine.state import waiting_on
from saga.messaging.events import EventRecords, UnroutedEvents

__all__ = [
    "SagaStats",
    "SagaWaiting",
    "collect",
    "longest_waiting",
    "oldest_running",
    "per_minute",
]

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
SELECT id, name, status, step, updated_at, step_state FROM {schema}.saga_instances
WHERE status IN ('running', 'compensating') AND updated_at < now() - %s::interval
ORDER BY updated_at LIMIT %s
"""

_STUCK_COUNT = """
SELECT count(*) FROM {schema}.saga_instances
WHERE status IN ('running', 'compensating') AND updated_at < now() - %s::interval
"""

_PER_MINUTE = """
SELECT m,
       (SELECT count(*) FROM {schema}.saga_instances
        WHERE started_at >= m AND started_at < m + interval '1 minute'),
       (SELECT count(*) FROM {schema}.saga_instances
        WHERE finished_at >= m AND finished_at < m + interval '1 minute'
          AND status IN ('completed', 'compensated'))
FROM generate_series(date_trunc('minute', now()) - %(span)s::interval + interval '1 minute',
                     date_trunc('minute', now()), interval '1 minute') AS m
ORDER BY m
"""

_OLDEST_RUNNING = """
SELECT id, name, status, step, started_at, updated_at, waiting_for
FROM {schema}.saga_instances
WHERE status IN ('running', 'compensating') AND waiting_for IS NULL
ORDER BY started_at, id LIMIT %s
"""

_LONGEST_WAITING = """
SELECT id, name, status, step, started_at, coalesce(step_started_at, updated_at), waiting_for
FROM {schema}.saga_instances
WHERE waiting_for IS NOT NULL
ORDER BY coalesce(step_started_at, updated_at), id LIMIT %s
"""


@dataclass(frozen=True, slots=True)
class SagaWaiting:
    """A saga that has not finished: running since ``started_at``, idle since ``since``,
    waiting for the event ``waiting_for`` (if any)."""

    id: UUID
    name: str
    status: str
    step: str | None
    started_at: datetime
    since: datetime
    waiting_for: str | None


def per_minute(
    tx: Tx, schema: str, span: timedelta = timedelta(hours=1)
) -> list[tuple[datetime, int, int]]:
    """(minute, sagas started, sagas finished) for each minute of the last ``span``.

    Finished means completed or compensated: a saga held for an operator has its
    ``finished_at`` set (when it stopped) but is not finished."""
    return tx.execute(render(_PER_MINUTE, schema), {"span": span}).fetchall()


def oldest_running(tx: Tx, schema: str, limit: int) -> list[SagaWaiting]:
    """The running or compensating sagas (not waiting for an event) started longest ago."""
    return [SagaWaiting(*row) for row in tx.execute(render(_OLDEST_RUNNING, schema), (limit,))]


def longest_waiting(tx: Tx, schema: str, limit: int) -> list[SagaWaiting]:
    """The sagas waiting for an event (a signal, a timer) the longest."""
    return [SagaWaiting(*row) for row in tx.execute(render(_LONGEST_WAITING, schema), (limit,))]


@dataclass
class SagaStats:
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    durations: dict[str, dict[str, float]] = field(default_factory=dict)
    oldest_running: dict[str, datetime] = field(default_factory=dict)
    stuck_count: int = 0
    stuck: list[dict[str, Any]] = field(default_factory=list)
    #: events published that reached no subscriber, per type
    unrouted_events: list[UnroutedEvents] = field(default_factory=list)


def collect(
    tx: Tx,
    schema: str,
    *,
    window: timedelta,
    stuck_after: timedelta,
    stuck_limit: int = 20,
) -> SagaStats:
    stats = SagaStats()
    for name, status, count in tx.execute(render(_COUNTS, schema)):
        stats.counts.setdefault(name, {})[status] = count
    for name, p50, p95, count in tx.execute(render(_DURATIONS, schema), (window,)):
        stats.durations[name] = {"p50_s": float(p50), "p95_s": float(p95), "finished": count}
    for name, started in tx.execute(render(_OLDEST, schema)):
        stats.oldest_running[name] = started
    row = tx.execute(render(_STUCK_COUNT, schema), (stuck_after,)).fetchone()
    stats.stuck_count = int(row[0]) if row else 0
    for saga_id, name, status, step, updated, step_state in tx.execute(
        render(_STUCK, schema), (stuck_after, stuck_limit)
    ):
        stats.stuck.append(
            {
                "id": saga_id,
                "name": name,
                "status": status,
                "step": step,
                "waiting_on": waiting_on(step, step_state),
                "updated_at": updated,
            }
        )
    stats.unrouted_events = EventRecords(schema).unrouted(tx)
    return stats
