"""Prometheus metrics for relays and consumers (``--metrics-port``).

Counters and histograms are updated as work happens; the table-derived
gauges (outbox depth and age, pending dead letters, unfinished sagas; with a
PostgreSQL broker, its queues' depth and oldest message's age) are read from the
database at each scrape, so they always match it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from saga.db.connections import DIRECT, DatabaseAccess
from saga.db.sql import Tx, render
from saga.db.vacuum_horizon import read_vacuum_horizon, warn_if_held

logger = logging.getLogger(__name__)

_OUTBOX = """
SELECT count(*) FILTER (WHERE deliver_after IS NULL),
       count(*) FILTER (WHERE deliver_after IS NOT NULL),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE deliver_after IS NULL)), 0)
FROM {schema}.outbox
"""
_DEAD_LETTERS = """
SELECT consumer, reason, count(*) FROM {schema}.dead_letters WHERE status = 'pending' GROUP BY 1, 2
"""
_UNFINISHED = """
SELECT name, status, count(*) FROM {schema}.saga_instances
WHERE finished_at IS NULL GROUP BY 1, 2
"""

HANDLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENCY_BUCKETS = (
    0.001, 0.002, 0.003, 0.004, 0.005, 0.0065, 0.008, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03,
    0.04, 0.05, 0.065, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0,
)  # fmt: skip

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

#: A labelled metric family of :class:`Metrics`.
_Family = Counter | Histogram


class Metrics:
    """The metrics of one process, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._series: dict[tuple[_Family, tuple[str, ...]], Any] = {}
        r = self.registry
        self.published = Counter("saga_relay_published", "Outbox rows published.", registry=r)
        self.publish_failures = Counter(
            "saga_relay_publish_failures", "Outbox rows whose publish failed.", registry=r
        )
        self.handled = Counter(
            "saga_messages_handled", "Deliveries by outcome.", ["consumer", "outcome"], registry=r
        )
        self.handle_seconds = Histogram(
            "saga_handle_seconds",
            "Time to handle one delivery (excluding the batch commit).",
            ["consumer"],
            buckets=HANDLE_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "saga_consumer_batch_size",
            "Deliveries committed together in one consumer transaction.",
            ["consumer"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.delivery_latency = Histogram(
            "saga_delivery_latency_seconds",
            "From the commit of a message's outbox row (stamped by a consumer that published "
            "it right after committing; else the message's creation) to the commit of the "
            "transaction that handled it.",
            ["consumer"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "saga_retries",
            "Handler retries (immediate or delayed).",
            ["consumer", "kind"],
            registry=r,
        )
        self.dead_lettered = Counter(
            "saga_dead_lettered", "Messages dead-lettered.", ["consumer", "reason"], registry=r
        )
        self.saga_outcomes = Counter(
            "saga_outcomes", "Sagas reaching an outcome.", ["saga", "status"], registry=r
        )
        self.events_unrouted = Counter(
            "saga_events_unrouted",
            "Events published that no queue subscribes to (delivered to nobody; not an error).",
            ["event_type"],
            registry=r,
        )

    def series(self, family: _Family, *labels: str) -> Any:
        """The series of ``family`` with these label values, looked up once: prometheus'
        ``labels()`` validates and locks on every call, which a consumer would pay several
        times per delivery."""
        key = (family, labels)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = family.labels(*labels)
        return found

    def count_unrouted(self, event_types: list[str]) -> None:
        """One unrouted event per item of ``event_types``."""
        for event_type in event_types:
            self.events_unrouted.labels(event_type).inc()

    def watch_database(
        self, database_url: str, schema: str, access: DatabaseAccess = DIRECT
    ) -> None:
        """Also report outbox, dead-letter and saga gauges read from this database."""
        self.registry.register(DatabaseCollector(database_url, schema, access))

    def watch_vacuum(
        self, database_url: str, schema: str, place: str, access: DatabaseAccess = DIRECT
    ) -> None:
        """Also report what holds back vacuum on this database (``place``: its label, the
        service's ``database`` or the ``broker``'s), and warn in the logs past
        :data:`~saga.db.vacuum_horizon.WARN_AFTER`."""
        self.registry.register(VacuumCollector(database_url, schema, place, access))

    def watch_broker(self, read: Callable[[], Mapping[str, Any]]) -> None:
        """Also report a broker's queues, as ``read`` tells them at each scrape (a broker
        whose capabilities have ``queue_details``): messages by state, the oldest's age."""
        self.registry.register(BrokerCollector(read))

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        start_http_server(port, addr=address, registry=self.registry)
        logger.info("metrics on http://%s:%d/metrics", address, port)


class _ScrapedCollector(Collector):
    """Gauges read from a PostgreSQL database at scrape time, with an ``up`` gauge."""

    up_name = ""
    what = ""

    def __init__(self, database_url: str, access: DatabaseAccess) -> None:
        self.database_url = database_url
        self.access = access

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(self.up_name, f"1 if the last scrape read the {self.what}.")
        try:
            with (
                self.access.connect(self.database_url, connect_timeout=5) as conn,
                conn.transaction(),
            ):
                conn.execute("SET LOCAL statement_timeout = '5s'")
                families = self._read(conn)
        except psycopg.Error as exc:
            logger.warning("metrics could not read the %s: %s", self.what, type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _read(self, tx: Tx) -> list[GaugeMetricFamily]:
        raise NotImplementedError


class DatabaseCollector(_ScrapedCollector):
    """Gauges computed from the service database at scrape time."""

    up_name = "saga_metrics_database_up"
    what = "database"

    def __init__(self, database_url: str, schema: str, access: DatabaseAccess) -> None:
        super().__init__(database_url, access)
        self.outbox_query = render(_OUTBOX, schema)
        self.dead_letters_query = render(_DEAD_LETTERS, schema)
        self.unfinished_query = render(_UNFINISHED, schema)

    def _read(self, tx: Tx) -> list[GaugeMetricFamily]:
        ready, scheduled, oldest = _one(tx, self.outbox_query)
        letters = tx.execute(self.dead_letters_query).fetchall()
        unfinished = tx.execute(self.unfinished_query).fetchall()
        depth = GaugeMetricFamily("saga_outbox_depth", "Outbox rows ready to publish.")
        depth.add_metric([], ready)
        held = GaugeMetricFamily("saga_outbox_scheduled", "Outbox rows waiting for their time.")
        held.add_metric([], scheduled)
        age = GaugeMetricFamily(
            "saga_outbox_oldest_age_seconds", "Age of the oldest ready outbox row."
        )
        age.add_metric([], float(oldest))
        pending = GaugeMetricFamily(
            "saga_dead_letters_pending",
            "Dead letters awaiting an operator.",
            labels=["consumer", "reason"],
        )
        for consumer, reason, count in letters:
            pending.add_metric([consumer, reason], count)
        running = GaugeMetricFamily(
            "saga_unfinished", "Sagas not finished, by name and status.", labels=["saga", "status"]
        )
        for name, status, count in unfinished:
            running.add_metric([name, status], count)
        return [depth, held, age, pending, running]


class VacuumCollector(_ScrapedCollector):
    """The age of the oldest open transaction on a database and the dead tuples of the
    framework's tables in it, at scrape time."""

    what = "vacuum horizon"

    def __init__(self, database_url: str, schema: str, place: str, access: DatabaseAccess):
        super().__init__(database_url, access)
        self.schema = schema
        self.place = place
        self.up_name = f"saga_metrics_vacuum_{place}_up"

    def _read(self, tx: Tx) -> list[GaugeMetricFamily]:
        horizon = read_vacuum_horizon(tx, [self.schema])
        warn_if_held(horizon, f"{self.place} database")
        held = GaugeMetricFamily(
            "saga_oldest_transaction_age_seconds",
            "Age of the oldest transaction open on a database (it holds back vacuum); 0: none.",
            labels=["database"],
        )
        age = horizon.oldest.age_s if horizon.oldest else 0.0
        held.add_metric([self.place], age or 0.0)
        dead = GaugeMetricFamily(
            "saga_table_dead_tuples",
            "Dead tuples of a framework table, waiting for vacuum.",
            labels=["database", "table"],
        )
        for table, count in horizon.dead_tuples.items():
            dead.add_metric([self.place, table], count)
        return [held, dead]


class BrokerCollector(Collector):
    """Gauges of a broker's queues, read at scrape time through ``read`` (queue -> an object
    with ``ready``, ``in_flight``, ``delayed`` and ``oldest_age_s``), with an ``up`` gauge."""

    def __init__(self, read: Callable[[], Mapping[str, Any]]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("saga_metrics_broker_up", "1 if the last scrape read the broker.")
        try:
            queues = self.read()
        except Exception as exc:  # any broker or driver error: the up gauge says it
            logger.warning("metrics could not read the broker: %s", type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        messages = GaugeMetricFamily(
            "saga_broker_queue_messages",
            "Messages in a broker queue: ready, in_flight (leased) or delayed.",
            labels=["queue", "state"],
        )
        age = GaugeMetricFamily(
            "saga_broker_queue_oldest_age_seconds",
            "Age of the oldest message in a broker queue.",
            labels=["queue"],
        )
        for name, queue in queues.items():
            for state in ("ready", "in_flight", "delayed"):
                if getattr(queue, state) is not None:
                    messages.add_metric([name, state], getattr(queue, state))
            if queue.oldest_age_s is not None:
                age.add_metric([name], queue.oldest_age_s)
        yield messages
        yield age


def _one(tx: Tx, query: str) -> tuple[Any, ...]:
    row = tx.execute(query).fetchone()
    assert row is not None
    return tuple(row)
