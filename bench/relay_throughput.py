"""The relay alone: a full outbox drained by one relay, durable publishes to RabbitMQ."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from bench.environment import AMQP_URL, ScratchDatabase
from saga.broker.transport import BrokerConfig, Topology
from saga.messaging.envelope import Envelope
from saga.outbox_relay import Relay, RelayOptions

DESTINATION = "bench"


def _fill(url: str, count: int) -> None:
    from pydantic import BaseModel

    class BenchMessage(BaseModel):
        n: int

    rows = []
    for i in range(count):
        envelope = Envelope.wrap(BenchMessage(n=i))
        rows.append((envelope.message_id, DESTINATION, envelope.type, envelope.to_bytes()))
    with (
        psycopg.connect(url) as conn,
        conn.cursor() as cur,
        cur.copy(
            "COPY saga.outbox (message_id, destination, message_type, body) FROM STDIN"
        ) as copy,
    ):
        for row in rows:
            copy.write_row(row)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE saga.outbox")


@dataclass(frozen=True)
class Drain:
    """One relay draining a full outbox: how long it took, and the broker's CPU meanwhile."""

    messages: int
    seconds: float
    broker_cpu_seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def broker_cpu_us_per_message(self) -> float:
        return self.broker_cpu_seconds / self.messages * 1e6


def relay_drain(
    count: int,
    batch_size: int,
    broker_url: str = AMQP_URL,
    topology: Topology | None = None,
    broker_cpu: Callable[[], float] = lambda: 0.0,
) -> Drain:
    """One relay drains ``count`` outbox rows to the broker (claim, publish durably,
    delete); ``broker_cpu`` reads the broker's CPU seconds, before and after."""
    db = ScratchDatabase.create()
    topology = topology or Topology(queue_prefix="bench.relay.")
    broker = BrokerConfig(broker_url)
    try:
        _fill(db.url, count)
        with Relay(db.url, broker, RelayOptions(batch_size=batch_size), topology) as relay:
            cpu_before = broker_cpu()
            started = time.perf_counter()
            published = relay.drain()
            elapsed = time.perf_counter() - started
            cpu = broker_cpu() - cpu_before
        assert published == count, f"relayed {published} of {count}"
    finally:
        db.drop()
        with broker.connected() as conn:
            topology.queue(DESTINATION)(conn.channel()).delete()
    return Drain(count, elapsed, cpu)


def relay_rate(count: int, batch_size: int) -> float:
    """Messages per second from a full outbox to the broker (claim, publish, delete)."""
    return relay_drain(count, batch_size).rate
