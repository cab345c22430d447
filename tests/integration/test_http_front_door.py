"""The orders service's HTTP front door, driven by a real HTTP client on real PostgreSQL.

Each ``POST /orders`` writes the order row and starts its saga in one
transaction: both rows exist, or neither does, even when the database
connection is cut between the writes and the commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI
from psycopg_pool import AsyncConnectionPool

from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import SCHEMA_DIR, Cluster
from saga.examples.order_saga.http_api import BeforeCommit, create_app
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.example_cluster import services_in_threads

CONCURRENT = 50


@pytest.fixture
def orders_db(db: TestDatabase) -> TestDatabase:
    db.execute((SCHEMA_DIR / "orders.sql").read_text())
    return db


def new_order(i: int) -> dict[str, Any]:
    return {
        "order_id": f"o-{i:03d}",
        "customer_id": "c1",
        "sku": "sku-1",
        "quantity": 1,
        "amount_cents": 100 + i,
        "card_token": "tok",
        "region": "eu",
    }


@asynccontextmanager
async def front_door(
    url: str, before_commit: BeforeCommit | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client talking to the app over ASGI, the app on a pool of 10 connections."""
    async with AsyncConnectionPool(url, min_size=2, max_size=10, open=False) as pool:
        app: FastAPI = create_app(pool, before_commit=before_commit)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://orders") as client:
            yield client


async def post_all(client: httpx.AsyncClient, count: int) -> list[httpx.Response]:
    return list(
        await asyncio.gather(*(client.post("/orders", json=new_order(i)) for i in range(count)))
    )


def committed(db: TestDatabase) -> list[tuple[Any, ...]]:
    """(order id, saga id, saga status) of every order row and every saga, joined."""
    return db.rows(
        "SELECT o.id, s.id, s.status FROM orders o "
        "FULL JOIN saga.saga_instances s ON s.idempotency_key = o.id ORDER BY 1"
    )


def test_fifty_concurrent_orders_each_commit_with_their_saga(orders_db: TestDatabase) -> None:
    async def scenario() -> tuple[list[httpx.Response], httpx.Response, httpx.Response]:
        async with front_door(orders_db.url) as client:
            responses = await post_all(client, CONCURRENT)
            return responses, await client.get("/orders/o-007"), await client.get("/orders/nope")

    responses, shown, missing = asyncio.run(scenario())
    assert [r.status_code for r in responses] == [201] * CONCURRENT
    placed = {r.json()["order_id"]: r.json()["saga_id"] for r in responses}
    rows = committed(orders_db)
    assert [(o, str(s), status) for o, s, status in rows] == [
        (f"o-{i:03d}", placed[f"o-{i:03d}"], "running") for i in range(CONCURRENT)
    ]
    starts = orders_db.scalar(
        "SELECT count(*) FROM saga.outbox WHERE message_type = %s", ("saga.StartSaga",)
    )
    assert starts == CONCURRENT
    assert shown.status_code == 200
    assert shown.json() == {
        "order_id": "o-007",
        "customer_id": "c1",
        "amount_cents": 107,
        "status": "pending",
        "saga_id": placed["o-007"],
        "saga_status": "running",
        "saga_step": None,
    }
    assert missing.status_code == 404


def test_connection_killed_before_commit_leaves_neither_row(orders_db: TestDatabase) -> None:
    doomed = "o-025"
    seen_before_kill: list[int] = []

    async def kill_doomed(conn: psycopg.AsyncConnection[Any], order_id: str) -> None:
        """Cut this request's connection after both writes, before its commit."""
        if order_id != doomed:
            return
        cur = await conn.execute("SELECT count(*) FROM orders WHERE id = %s", (order_id,))
        seen_before_kill.append((await cur.fetchone() or (0,))[0])
        async with await psycopg.AsyncConnection.connect(orders_db.url, autocommit=True) as admin:
            # The timeout form waits until the backend has gone, so the commit surely fails.
            await admin.execute("SELECT pg_terminate_backend(%s, 10000)", (conn.info.backend_pid,))

    async def scenario() -> tuple[list[httpx.Response], httpx.Response]:
        async with front_door(orders_db.url, kill_doomed) as client:
            responses = await post_all(client, CONCURRENT)
            retried = await client.post("/orders", json=new_order(CONCURRENT))  # the pool recovers
            return responses, retried

    responses, retried = asyncio.run(scenario())
    codes = {new_order(i)["order_id"]: r.status_code for i, r in enumerate(responses)}
    assert codes.pop(doomed) == 503
    assert set(codes.values()) == {201}
    assert seen_before_kill == [1]  # the order row had been written when the connection died
    assert retried.status_code == 201
    rows = committed(orders_db)  # 49 of the 50, and the one placed after the kill
    assert len(rows) == CONCURRENT
    assert all(o is not None and s is not None for o, s, _ in rows)  # every order with its saga
    assert doomed not in [o for o, _, _ in rows]
    assert orders_db.scalar("SELECT count(*) FROM saga.outbox") == CONCURRENT


def test_front_door_orders_run_to_the_end(order_system: Cluster, rabbit: TestBroker) -> None:
    """The saga the front door starts runs like any other: its orders end approved."""
    url = order_system.database_urls["orders"]
    orders = [
        {**o.model_dump(), "order_id": f"web-{o.order_id}"}
        for o in workload.make_orders(3, workload.FailureRates(0, 0, 0, 0))
    ]

    async def place() -> list[int]:
        async with front_door(url) as client:
            return [(await client.post("/orders", json=o)).status_code for o in orders]

    async def show() -> list[dict[str, Any]]:
        async with front_door(url) as client:
            return [(await client.get(f"/orders/{o['order_id']}")).json() for o in orders]

    with services_in_threads(order_system, rabbit):
        assert asyncio.run(place()) == [201] * len(orders)
        counts = workload.wait_until_settled(order_system, len(orders), timeout=60)
    assert counts == {"completed": len(orders)}
    shown = asyncio.run(show())
    assert [(o["status"], o["saga_status"]) for o in shown] == [("approved", "completed")] * 3


def test_an_order_gives_its_lines_or_its_one_sku_and_a_muddled_one_is_refused(
    orders_db: TestDatabase,
) -> None:
    single = {k: v for k, v in new_order(1).items() if k not in ("sku", "quantity")}
    lines = [{"sku": "sku-1", "quantity": 2}, {"sku": "sku-2", "quantity": 1}]

    async def place(*bodies: dict[str, Any]) -> list[httpx.Response]:
        async with front_door(orders_db.url) as client:
            return [await client.post("/orders", json=body) for body in bodies]

    placed, muddled, empty = asyncio.run(
        place(
            {**single, "lines": lines},
            {**new_order(2), "lines": lines},  # lines and a sku that is not them
            {**single, "order_id": "o-003"},  # neither
        )
    )
    assert placed.status_code == 201
    data = orders_db.scalar("SELECT data FROM saga.saga_instances WHERE idempotency_key = 'o-001'")
    assert data["lines"] == lines and data["sku"] is None
    assert (muddled.status_code, empty.status_code) == (422, 422)
    assert "not both" in muddled.text and "needs lines" in empty.text
    assert [o for o, _, _ in committed(orders_db)] == ["o-001"]  # nothing else was written
