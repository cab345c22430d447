"""A two-service saga written from the docs alone, run from the installed wheel on the real
PostgreSQL and RabbitMQ: a shop (a local step, a remote charge with a compensation, a final
local step) and a billing participant, each with its own database, relay and consumer.

The wheel is built and installed in a fresh virtualenv as in ``test_demo_wheel``; the
user's code lives in an empty folder, and every command is the virtualenv's ``saga``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.acceptance.test_demo_wheel import build_wheel, fresh_venv, run
from tests.support.brokers import TestBroker
from tests.support.databases import DatabaseFactory, TestDatabase
from tests.support.wait import wait_until

CONTRACTS = """
from pydantic import BaseModel


class Charge(BaseModel):
    order_id: str
    customer_id: str
    amount_cents: int


class Charged(BaseModel):
    charge_id: str


class Refund(BaseModel):
    order_id: str
"""

SHOP = """
from pydantic import BaseModel

from contracts import Charge, Charged, Refund
from saga import Saga, SagaRegistry


class OrderData(BaseModel):
    order_id: str
    customer_id: str
    amount_cents: int
    charge_id: str | None = None


create_order = Saga("create_order", data=OrderData, version=1)


@create_order.local("create_pending_order", compensate="reject_order")
def create_pending_order(tx, d: OrderData) -> None:
    tx.execute("INSERT INTO orders (id, status) VALUES (%s, 'pending')", (d.order_id,))


@create_order.local_compensation("reject_order")
def reject_order(tx, d: OrderData) -> None:
    tx.execute("UPDATE orders SET status = 'rejected' WHERE id = %s", (d.order_id,))


create_order.remote(
    "charge",
    service="billing",
    command=Charge,
    reply=Charged,
    on_reply=lambda d, r: d.model_copy(update={"charge_id": r.charge_id}),
    compensate=Refund,
)


@create_order.local("approve_order")
def approve_order(tx, d: OrderData) -> None:
    tx.execute("UPDATE orders SET status = 'approved' WHERE id = %s", (d.order_id,))


registry = SagaRegistry("shop")
registry.register(create_order)
"""

BILLING = """
from contracts import Charge, Charged, Refund
from saga import Service, StepFailed

billing = Service("billing")


@billing.handler(Charge)
def charge(tx, cmd: Charge, ctx) -> Charged:
    if cmd.amount_cents > 50_000:
        raise StepFailed("over the card's limit")
    tx.execute(
        "INSERT INTO charges (key, order_id, amount_cents) VALUES (%s, %s, %s)",
        (ctx.idempotency_key, cmd.order_id, cmd.amount_cents),
    )
    return Charged(charge_id=ctx.idempotency_key)


@billing.handler(Refund)
def refund(tx, cmd: Refund, ctx) -> None:
    tx.execute("UPDATE charges SET refunded = true WHERE key = %s", (ctx.compensated_key,))
"""

START = """
import os

import psycopg

from saga import IdempotencyKeyReused
from shop import OrderData, create_order

with psycopg.connect(os.environ["SAGA_DATABASE_URL"], autocommit=True) as conn:
    for order_id, amount in (("o-1", 4200), ("o-2", 99_000)):
        data = OrderData(order_id=order_id, customer_id="c-1", amount_cents=amount)
        with conn.transaction():
            create_order.start(conn, data, idempotency_key="checkout-" + order_id)
    try:
        with conn.transaction():
            other = OrderData(order_id="o-1", customer_id="c-1", amount_cents=1)
            create_order.start(conn, other, idempotency_key="checkout-o-1")
    except IdempotencyKeyReused as refused:
        print("refused:", refused)
"""

SHOP_TABLES = "CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL)"
BILLING_TABLES = """CREATE TABLE charges (key text PRIMARY KEY, order_id text NOT NULL,
    amount_cents bigint NOT NULL, refunded boolean NOT NULL DEFAULT false)"""


@contextmanager
def running(venv: Path, folder: Path, env: dict[str, str], *args: str) -> Iterator[None]:
    """``saga *args`` from the virtualenv, in the user's folder, stopped with SIGTERM."""
    log = (folder / f"{'-'.join(args[:2])}-{env['SAGA_DATABASE_URL'][-6:]}.log").open("wb")
    proc = subprocess.Popen(
        [str(venv / "bin" / "saga"), *args], cwd=folder, env=env, stdout=log, stderr=log
    )
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_a_saga_written_from_the_docs_runs_from_the_wheel(
    tmp_path: Path, empty_db: TestDatabase, database_factory: DatabaseFactory, rabbit: TestBroker
) -> None:
    venv = fresh_venv(tmp_path, build_wheel(tmp_path))
    folder = tmp_path / "user"
    folder.mkdir()
    for name, text in (("contracts", CONTRACTS), ("shop", SHOP), ("billing", BILLING),
                       ("start", START)):  # fmt: skip
        (folder / f"{name}.py").write_text(text)
    billing_db = database_factory.create_empty()
    rabbit.use("shop", "billing")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    base.pop("PYTHONPATH", None)
    broker = {"SAGA_BROKER_URL": rabbit.url, "SAGA_QUEUE_PREFIX": rabbit.topology.queue_prefix}
    shop_env = {**base, **broker, "SAGA_DATABASE_URL": empty_db.url}
    billing_env = {**base, **broker, "SAGA_DATABASE_URL": billing_db.url}
    saga = str(venv / "bin" / "saga")
    try:
        for env, tables in ((shop_env, SHOP_TABLES), (billing_env, BILLING_TABLES)):
            run([saga, "db", "migrate"], folder, env)
            TestDatabase(env["SAGA_DATABASE_URL"], "").execute(tables)
        with ExitStack() as services:
            for env, target in ((shop_env, "shop:registry"), (billing_env, "billing:billing")):
                services.enter_context(running(venv, folder, env, "relay"))
                services.enter_context(running(venv, folder, env, "consume", target))
            started = run([str(venv / "bin" / "python"), "start.py"], folder, shop_env)
            assert "refused: saga 'create_order': idempotency key 'checkout-o-1'" in started.stdout

            wait_until(
                lambda: (
                    dict(empty_db.rows("SELECT id, status FROM orders"))
                    == {"o-1": "approved", "o-2": "rejected"}
                ),
                timeout=120,
                what="both orders settled",
            )
        listed = json.loads(run([saga, "list", "--json"], folder, shop_env).stdout)
        assert sorted(s["status"] for s in listed) == ["compensated", "completed"]
        found = run([saga, "list", "--data", "order_id=o-2", "--json"], folder, shop_env).stdout
        assert [s["status"] for s in json.loads(found)] == ["compensated"]
        assert empty_db.rows("SELECT step, last_error FROM saga.saga_failures") == [
            ("charge", "charge: over the card's limit")
        ]
        assert billing_db.rows("SELECT order_id, refunded FROM charges") == [("o-1", False)]
    finally:
        database_factory.drop(billing_db.name)
