"""The dashboard's saga list and saga detail pages with 1,000,000 sagas in the database.

A scratch database gets a million sagas (and four step-log rows and a participant's reply
each) from ``generate_series`` in a few statements; ``saga dashboard``'s application then
serves on a local port (uvicorn, as the command runs it) and each page is fetched over
HTTP: a few warm-up requests, then ``samples`` timed ones. The target: every list and
detail page answers in under 300 ms (p95). The database is dropped after.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlencode

import httpx
import psycopg
import uvicorn

from bench.environment import ScratchDatabase
from saga.dashboard.app import DashboardConfig, create_app
from saga.dashboard.databases import Databases, ServiceDatabase
from saga.dashboard.security import Guard

TARGET_MS = 300.0

_SAGAS = """
INSERT INTO saga.saga_instances
    (id, name, saga_version, service, status, step, data, completed_steps, last_error,
     started_at, updated_at, finished_at)
SELECT gen_random_uuid(),
       (ARRAY['create_order', 'refund_order', 'ship_order'])[1 + i %% 3], 1, 'orders',
       CASE WHEN i %% 100 < 90 THEN 'completed' WHEN i %% 100 < 95 THEN 'compensated'
            WHEN i %% 100 < 98 THEN 'running' WHEN i %% 100 < 99 THEN 'step_dead_lettered'
            ELSE 'compensation_failed' END,
       'charge_payment',
       jsonb_build_object('order_id', 'o-' || i, 'customer_id', 'c-' || (i %% 5000),
                          'sku', 'sku-' || (i %% 40), 'quantity', 1 + i %% 3,
                          'amount_cents', (i::bigint * 7919) %% 50000, 'card_token', 'tok_' || i,
                          'region', 'north'),
       ARRAY['create_pending_order', 'reserve_stock', 'reserve_credit'],
       CASE WHEN i %% 100 >= 90 THEN 'charge_payment: card declined' END,
       now() - make_interval(secs => (%(sagas)s - i) * 2.5),
       now() - make_interval(secs => (%(sagas)s - i) * 2.5 - 2),
       CASE WHEN i %% 100 < 95 OR i %% 100 >= 98
            THEN now() - make_interval(secs => (%(sagas)s - i) * 2.5 - 2) END
FROM generate_series(1, %(sagas)s) AS i
"""

_STEPS = """
INSERT INTO saga.saga_steps
    (saga_id, step, phase, attempt, outcome, started_at, finished_at, error, message_id)
SELECT s.id, st.step, 'forward', 1, st.outcome,
       s.started_at + make_interval(secs => st.n * 0.3),
       s.started_at + make_interval(secs => st.n * 0.3 + 0.2),
       CASE WHEN st.outcome = 'failed' THEN 'card declined' END, gen_random_uuid()
FROM saga.saga_instances s
CROSS JOIN LATERAL (VALUES
    (0, 'create_pending_order', 'succeeded'), (1, 'reserve_stock', 'succeeded'),
    (2, 'reserve_credit', 'succeeded'),
    (3, 'charge_payment', CASE WHEN s.last_error IS NULL THEN 'succeeded' ELSE 'failed' END)
) AS st(n, step, outcome)
"""

_REPLIES = """
INSERT INTO saga.inbox_replies
    (consumer, message_id, reply_id, destination, message_type, saga_id, body, sent_at)
SELECT 'inventory', gen_random_uuid(), gen_random_uuid(), 'orders', 'StockReserved', id,
       '\\x7b7d'::bytea, started_at
FROM saga.saga_instances
"""


def fill(url: str, sagas: int) -> float:
    """Insert ``sagas`` sagas with their step log and replies; return the seconds it took."""
    began = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_SAGAS, {"sagas": sagas})
        conn.execute(_STEPS)
        conn.execute(_REPLIES)
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - began


@contextmanager
def serving(url: str) -> Iterator[str]:
    """The dashboard over ``url`` (as service ``orders``) on a local port, in a thread."""
    app = create_app(DashboardConfig(Databases([ServiceDatabase("orders", url)]), Guard(None)))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the dashboard did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]  # the free port it was given
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def _timed(client: httpx.Client, paths: list[str], warm_up: int = 3) -> dict[str, float]:
    for path in paths[:warm_up]:
        client.get(path).raise_for_status()
    times = []
    for path in paths:
        began = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - began) * 1000)
        response.raise_for_status()
    times.sort()
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[max(0, round(0.95 * len(times)) - 1)], 1),
        "max_ms": round(times[-1], 1),
    }


def _pages(url: str, sagas: int, samples: int) -> dict[str, list[str]]:
    """The pages to time, each ``samples`` times (details of different sagas)."""
    with psycopg.connect(url) as conn:
        ids = [
            str(row[0])
            for row in conn.execute(
                "SELECT id FROM saga.saga_instances TABLESAMPLE SYSTEM (1) LIMIT %s", (samples,)
            )
        ]
        deep = conn.execute(
            "SELECT started_at, id FROM saga.saga_instances ORDER BY started_at DESC, id DESC "
            "OFFSET %s LIMIT 1",
            (sagas // 2,),
        ).fetchone()
        day = conn.execute(
            "SELECT now() - interval '20 days', now() - interval '19 days', "
            "now() - interval '20 days' + interval '1 hour'"
        )
        start, end, hour = day.fetchone() or (None, None, None)
    assert deep is not None and start is not None and end is not None and hour is not None

    def listing(**params: str) -> str:
        return "/sagas?" + urlencode({"service": "orders", **params})

    one_day = {"from": start.isoformat(), "to": end.isoformat()}
    one_hour = {"from": start.isoformat(), "to": hour.isoformat()}
    return {
        "list, newest first": [listing()] * samples,
        "list, status step_dead_lettered": [listing(status="step_dead_lettered")] * samples,
        "list, name and status": [listing(name="ship_order", status="compensated")] * samples,
        f"list, {sagas // 2:,} sagas down (keyset)": [
            listing(after=f"{deep[0].isoformat()}_{deep[1]}")
        ]
        * samples,
        "list, started within a day": [listing(**one_day)] * samples,
        "list, by id": [listing(id=saga_id) for saga_id in ids],
        "list, text in data within an hour": [listing(text="c-4242", **one_hour)] * samples,
        "list, text in data within a day": [listing(text="c-4242", **one_day)] * samples,
        "saga detail": [f"/sagas/orders/{saga_id}" for saga_id in ids],
    }


def measure(sagas: int = 1_000_000, samples: int = 30) -> tuple[dict[str, Any], float]:
    """(page -> latency figures, seconds spent filling) on a scratch database."""
    database = ScratchDatabase.create("saga_bench_dashboard")
    try:
        filled = fill(database.url, sagas)
        pages = _pages(database.url, sagas, samples)
        with serving(database.url) as base, httpx.Client(base_url=base, timeout=60) as client:
            return {name: _timed(client, paths) for name, paths in pages.items()}, filled
    finally:
        database.drop()


def main() -> None:
    figures, filled = measure()
    print(f"filled in {filled:.0f}s")
    for name, figure in figures.items():
        verdict = "ok" if figure["p95_ms"] < TARGET_MS else "OVER TARGET"
        print(
            f"{name:40} p50 {figure['p50_ms']:7.1f} ms  p95 {figure['p95_ms']:7.1f} ms  {verdict}"
        )


if __name__ == "__main__":
    main()
