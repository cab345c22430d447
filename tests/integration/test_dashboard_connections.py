"""The dashboard's connections: four at most per database, however many pages load at once
(docs/dashboard.md); each statement bounded by ``statement_timeout``, a startup option that
is left out behind PgBouncer, which refuses it (docs/scaling.md)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from starlette.testclient import TestClient

from saga.dashboard.app import DashboardConfig, create_app
from saga.dashboard.databases import STATEMENT_TIMEOUT_S, Databases, ServiceDatabase
from saga.dashboard.security import Guard
from saga.db.connections import POOLED_POLLING
from tests.rig.pgbouncer_server import PgBouncerServer
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


def test_statement_timeout_bounds_every_statement_and_is_left_out_behind_pgbouncer(
    db: TestDatabase, pgbouncer: PgBouncerServer
) -> None:
    """Directly, a dashboard connection has the 20 s timeout; behind PgBouncer (which refuses
    startup options) the pages load, and the timeout is the database's or role's own."""
    db.execute(f"ALTER DATABASE {db.name} SET statement_timeout = '7s'")
    direct = Databases([ServiceDatabase("trips", db.url)])
    direct.open()
    try:
        with direct.connect("trips") as conn:
            shown = conn.execute("SHOW statement_timeout").fetchone()
        assert shown == (f"{STATEMENT_TIMEOUT_S}s",)
    finally:
        direct.close()
    pooled = Databases([ServiceDatabase("trips", pgbouncer.url_for(db.url))], access=POOLED_POLLING)
    with TestClient(create_app(DashboardConfig(pooled, Guard(None)))) as client:
        assert client.get("/sagas").status_code == 200
        with pooled.connect("trips") as conn:
            shown = conn.execute("SHOW statement_timeout").fetchone()
        assert shown == ("7s",)  # the database's own setting, not the startup option
