"""Submits orders with configurable failure rates at each step, and waits for the outcome."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from saga import Saga
from saga.examples.order_saga import cluster, invariants
from saga.examples.order_saga.cluster import Cluster
from saga.examples.order_saga.gateway import DECLINED
from saga.examples.order_saga.orders import OrderData, OrderLine, create_order


@dataclass(frozen=True)
class FailureRates:
    """Probability that an order fails at each step (through its data, not a flag)."""

    stock: float = 0.05
    credit: float = 0.05
    payment: float = 0.05
    shipment: float = 0.05


#: A generated order has one to this many lines (each of a different sku).
MAX_LINES = 3


def lines_taken(saga: Saga[OrderData]) -> int:
    """The most lines an order may have on ``saga``: versions 1 and 2 reserve one sku."""
    return MAX_LINES if saga.version >= 3 else 1


def make_orders(
    count: int, rates: FailureRates, seed: int = 7, prefix: str = "o", max_lines: int = MAX_LINES
) -> list[OrderData]:
    """``count`` orders of one to ``max_lines`` lines; an order meant to fail on stock has
    the rare sku (none in stock) on one of its lines."""
    rng = random.Random(seed)
    orders = []
    for i in range(count):
        roll = rng.random()
        edges = [rates.stock, rates.credit, rates.payment, rates.shipment]
        bounds = [sum(edges[: k + 1]) for k in range(4)]
        skus = rng.sample(cluster.COMMON_SKUS, rng.randint(1, max_lines))
        if roll < bounds[0]:
            skus[rng.randrange(len(skus))] = cluster.RARE_SKU
        orders.append(
            OrderData(
                order_id=f"{prefix}-{i:06d}",
                customer_id=cluster.BROKE_CUSTOMER
                if bounds[0] <= roll < bounds[1]
                else rng.choice(cluster.RICH_CUSTOMERS),
                lines=[OrderLine(sku=sku, quantity=rng.randint(1, 3)) for sku in skus],
                amount_cents=rng.randint(100, 50_000),
                card_token=DECLINED
                if bounds[1] <= roll < bounds[2]
                else f"tok_{rng.randrange(10**6)}",
                region=cluster.CLOSED_REGION
                if bounds[2] <= roll < bounds[3]
                else rng.choice(cluster.OPEN_REGIONS),
            )
        )
    return orders


def submit(
    system: Cluster,
    orders: list[OrderData],
    on_progress: Callable[[int], None] | None = None,
    per_transaction: int = 20,
    rate: float | None = None,
    saga: Saga[OrderData] = create_order,
) -> None:
    """Start one saga per order (idempotency key: the order id), a few per transaction:
    all at once, or ``rate`` orders a second as a steady stream (as a shop's would come).
    ``saga`` is the version they start on (``orders.create_order_v1`` reserves one
    after the other, to measure against the parallel versions in the same run; versions 1
    and 2 take orders of one line, see :func:`lines_taken`)."""
    if rate:
        per_transaction = max(1, min(per_transaction, round(rate / 20)))
    began = time.monotonic()
    with system.connect("orders") as conn:
        for start in range(0, len(orders), per_transaction):
            if rate:
                time.sleep(max(0.0, began + start / rate - time.monotonic()))
            chunk = orders[start : start + per_transaction]
            with conn.transaction():
                for order in chunk:
                    saga.start(conn, order, idempotency_key=order.order_id)
            if on_progress:
                on_progress(len(chunk))


def status_counts(system: Cluster, prefix: str | None = None) -> dict[str, int]:
    with system.connect("orders") as conn:
        rows = conn.execute(
            "SELECT status, count(*) FROM saga.saga_instances "
            "WHERE %s::text IS NULL OR data->>'order_id' LIKE %s || '-%%' GROUP BY status",
            (prefix, prefix),
        ).fetchall()
    return {status: count for status, count in rows}


def wait_until_settled(
    system: Cluster,
    total: int,
    timeout: float,
    on_progress: Callable[[int], None] | None = None,
    prefix: str | None = None,
) -> dict[str, int]:
    """Poll until ``total`` sagas are finished (or need an operator); return the counts."""
    deadline = time.monotonic() + timeout
    done = 0
    while True:
        counts = status_counts(system, prefix)
        settled = sum(n for s, n in counts.items() if s not in ("running", "compensating"))
        if on_progress and settled > done:
            on_progress(settled - done)
        done = max(done, settled)
        if settled >= total or time.monotonic() > deadline:
            return counts
        time.sleep(0.2)


def wait_for_events(system: Cluster, timeout: float) -> bool:
    """Poll until the events subscribers have caught up with orders (False: not in time)."""
    deadline = time.monotonic() + timeout
    while not invariants.events_delivered(system):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def quiescent(system: Cluster, expected: int) -> bool:
    """True when ``expected`` sagas are finished, no outbox holds a ready message, and the
    events subscribers have caught up."""
    counts = status_counts(system)
    if counts.get("completed", 0) + counts.get("compensated", 0) < expected:
        return False
    if not invariants.events_delivered(system):
        return False
    for service in system.services:
        with system.connect(service) as conn:
            row = conn.execute(
                "SELECT count(*) FROM saga.outbox WHERE deliver_after IS NULL"
            ).fetchone()
        if row and row[0]:
            return False
    return True


def sample_sagas(system: Cluster, statuses: tuple[str, ...], each: int = 1) -> list[Any]:
    with system.connect("orders") as conn:
        return [
            row[0]
            for status in statuses
            for row in conn.execute(
                "SELECT id FROM saga.saga_instances WHERE status = %s ORDER BY started_at LIMIT %s",
                (status, each),
            ).fetchall()
        ]
