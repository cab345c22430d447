"""The dashboard's connections (docs/dashboard.md): four at most per database, however
many pages load at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from starlette.testclient import TestClient

from saga.dashboard.app import DashboardConfig, create_app
from saga.dashboard.security import Guard
from saga.dashboard.sources import Databases, ServiceDatabase
from tests.support.databases import TestDatabase
from tests.support.wait import wait_until

PAGES = 10
MOST = 4

_BACKENDS = """
SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), count(*)
FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


def test_pages_loading_at_once_share_four_connections_at_most(db: TestDatabase) -> None:
    """Ten pages load while the sagas table is locked: four of them wait in PostgreSQL on
    the dashboard's four connections, the others for a connection; once the lock is gone
    every page loads, and the dashboard holds four connections."""
    databases = Databases([ServiceDatabase("trips", db.url)])
    app = create_app(DashboardConfig(databases, Guard(None)))
    with (
        TestClient(app) as client,
        ThreadPoolExecutor(PAGES) as pages,
        db.connect(autocommit=True) as watcher,
    ):

        def backends() -> tuple[int, int]:
            row = watcher.execute(_BACKENDS).fetchone()
            assert row is not None
            return int(row[0]), int(row[1])

        with db.connect(autocommit=False) as blocker, blocker.transaction():
            blocker.execute("LOCK TABLE saga.saga_instances IN ACCESS EXCLUSIVE MODE")
            loads = [pages.submit(client.get, "/sagas") for _ in range(PAGES)]
            wait_until(lambda: backends()[0] >= MOST, timeout=60, what="four pages waiting")
        assert [load.result(timeout=60).status_code for load in loads] == [200] * PAGES
        assert backends() == (0, MOST)
