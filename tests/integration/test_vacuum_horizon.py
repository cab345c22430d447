"""Operators see what holds back vacuum: the oldest open transaction on each database
(its age, client and state) and the dead tuples of the framework's tables, in
``saga stats``, the metrics and the logs."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from saga.db.vacuum_horizon import read_vacuum_horizon, warn_if_held
from saga.observability.metrics import Metrics
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.wait import wait_until


@contextmanager
def held_snapshot(url: str, application: str) -> Iterator[int]:
    """A session ``idle in transaction`` holding a snapshot, as a forgotten psql window
    does; its pid."""
    with psycopg.connect(url, application_name=application) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT 1")
        yield conn.info.backend_pid
        conn.rollback()


def _stats(db: TestDatabase, broker: TestBroker) -> dict[str, Any]:
    result = saga_cli(db.url, "stats", "--json", SAGA_BROKER_URL=broker.url)
    assert result.returncode == 0, result.stderr
    vacuum: dict[str, Any] = json.loads(result.stdout)["vacuum"]
    return vacuum


def test_saga_stats_shows_the_transaction_holding_back_vacuum_on_each_database(
    db: TestDatabase, pg_broker: TestBroker
) -> None:
    pg_broker.declare("svc")
    with (
        held_snapshot(db.url, "nightly-report") as report,
        held_snapshot(pg_broker.url, "forgotten-psql") as psql,
    ):
        # the broker's database is shared with other tests: wait for ours to be the oldest
        found: dict[str, Any] = {}
        wait_until(
            lambda: (
                found.update(_stats(db, pg_broker))
                or (found["broker"]["oldest"] or {}).get("pid") == psql
            ),
            what="the held snapshot seen as the broker database's oldest transaction",
        )
        service = found["database"]["oldest"]
        assert (service["pid"], service["application"]) == (report, "nightly-report")
        assert service["state"] == "idle in transaction" and service["age_s"] > 0
        assert found["broker"]["oldest"]["application"] == "forgotten-psql"
        assert f"{db.schema}.outbox" in found["database"]["dead_tuples"]
        assert "saga_broker.messages" in found["broker"]["dead_tuples"]
        table = saga_cli(db.url, "stats", "--broker-url", pg_broker.url).stdout
        assert "oldest open transaction" in table and "nightly-report" in table, table
    assert _stats(db, pg_broker)["database"]["oldest"] is None


def test_metrics_gauge_the_oldest_transaction_and_the_dead_tuples(db: TestDatabase) -> None:
    registry = CollectorRegistry()
    Metrics(registry).watch_vacuum(db.url, db.schema, "service")
    value = registry.get_sample_value
    age = {"database": "service"}
    assert value("saga_oldest_transaction_age_seconds", age) == 0
    with held_snapshot(db.url, "nightly-report"):
        held = value("saga_oldest_transaction_age_seconds", age)
        assert held is not None and held > 0
        db.execute(
            "INSERT INTO saga.outbox (message_id, destination, message_type, body) "
            "SELECT gen_random_uuid(), 'svc', 'Ping', '\\x00' FROM generate_series(1, 50)"
        )
        db.execute("DELETE FROM saga.outbox")
        outbox = {"database": "service", "table": f"{db.schema}.outbox"}
        wait_until(
            lambda: (value("saga_table_dead_tuples", outbox) or 0) >= 50,
            what="the outbox's dead tuples gauged",
        )


def test_a_transaction_held_past_the_threshold_is_logged(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    with held_snapshot(db.url, "nightly-report") as pid, db.connect() as conn:
        horizon = read_vacuum_horizon(conn, [db.schema])
        with caplog.at_level(logging.WARNING, logger="saga.db.vacuum_horizon"):
            assert not warn_if_held(horizon, "service database", threshold=3600)
            assert caplog.records == []
            assert warn_if_held(horizon, "service database", threshold=0)
    (record,) = caplog.records
    assert "held back vacuum on the service database" in record.getMessage()
    assert f"pid {pid}" in record.getMessage() and "nightly-report" in record.getMessage()
