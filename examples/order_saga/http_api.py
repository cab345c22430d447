"""The orders service's HTTP front door (FastAPI, async psycopg).

``POST /orders`` writes the order row and starts its ``create_order`` saga in ONE
transaction: both exist, or neither does. ``GET /orders/{id}`` shows the order
and where its saga is. Run it against the orders database::

    SAGA_DATABASE_URL=postgresql://... \
        uvicorn --factory saga.examples.order_saga.http_api:app_from_env

(``pip install 'saga-outbox[web]' uvicorn``). The saga then runs in the orders
service's consumer (``saga consume saga.examples.order_saga.orders:registry``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

import psycopg
from fastapi import FastAPI, HTTPException
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field, ValidationError

from saga.examples.order_saga.orders import OrderData, OrderLine, create_order

_INSERT_ORDER = """
INSERT INTO orders (id, customer_id, amount_cents, status) VALUES (%s, %s, %s, 'pending')
"""

# The order's saga is the one started with the order id as its idempotency key.
_ORDER_AND_SAGA = """
SELECT o.id AS order_id, o.customer_id, o.amount_cents, o.status,
       s.id AS saga_id, s.status AS saga_status, s.step AS saga_step
FROM orders o
LEFT JOIN saga.saga_instances s ON s.name = %s AND s.idempotency_key = o.id
WHERE o.id = %s
"""

#: Awaited inside the transaction, after both writes and before the commit (tests
#: use it to cut the database connection at exactly that point).
BeforeCommit = Callable[[psycopg.AsyncConnection[Any], str], Awaitable[None]]


class NewOrder(BaseModel):
    """An order: its ``lines`` (each a sku and a quantity), or one ``sku`` and ``quantity``."""

    customer_id: str
    lines: list[OrderLine] = []
    sku: str | None = None
    quantity: int | None = Field(None, gt=0)
    amount_cents: int = Field(gt=0)
    card_token: str
    region: str
    #: The caller's id for the order (a retry with the same id is refused with 409).
    order_id: str | None = None


class PlacedOrder(BaseModel):
    order_id: str
    saga_id: UUID


class OrderStatus(BaseModel):
    order_id: str
    customer_id: str
    amount_cents: int
    status: str
    saga_id: UUID | None
    saga_status: str | None
    saga_step: str | None


def create_app(pool: AsyncConnectionPool, *, before_commit: BeforeCommit | None = None) -> FastAPI:
    """The front door on ``pool`` (connections to the orders database, opened by the caller)."""
    app = FastAPI(title="orders")

    @app.post("/orders", status_code=201)
    async def place_order(order: NewOrder) -> PlacedOrder:
        order_id = order.order_id or f"web-{uuid.uuid4().hex}"
        try:
            data = OrderData(order_id=order_id, **order.model_dump(exclude={"order_id"}))
        except ValidationError as exc:
            raise HTTPException(422, exc.errors(include_url=False, include_context=False)) from None
        try:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute(_INSERT_ORDER, (order_id, order.customer_id, order.amount_cents))
                saga_id = await create_order.start_async(conn, data, idempotency_key=order_id)
                if before_commit is not None:
                    await before_commit(conn, order_id)
        except psycopg.errors.UniqueViolation:
            raise HTTPException(409, f"order {order_id} exists") from None
        except psycopg.OperationalError:
            raise HTTPException(
                503, "the orders database is unavailable; nothing was saved"
            ) from None
        return PlacedOrder(order_id=order_id, saga_id=saga_id)

    @app.get("/orders/{order_id}")
    async def show_order(order_id: str) -> OrderStatus:
        async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(_ORDER_AND_SAGA, (create_order.name, order_id))
            row = await cur.fetchone()
        if row is None:
            raise HTTPException(404, f"no order {order_id}")
        return OrderStatus(**row)

    return app


def app_from_env() -> FastAPI:
    """The front door on ``SAGA_DATABASE_URL`` (for ``uvicorn --factory``)."""
    pool = AsyncConnectionPool(os.environ["SAGA_DATABASE_URL"], open=False)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with pool:
            yield

    app = create_app(pool)
    app.router.lifespan_context = lifespan
    return app
