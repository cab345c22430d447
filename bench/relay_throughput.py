"""The relay alone: a full outbox drained by one relay, durable publishes to RabbitMQ."""

from __future__ import annotations

import time

import psycopg
from kombu import Connection

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


def relay_rate(count: int, batch_size: int) -> float:
    """Messages per second from a full outbox to the broker (claim, publish in tx, delete)."""
    db = ScratchDatabase.create()
    topology = Topology(queue_prefix="bench.relay.")
    try:
        _fill(db.url, count)
        with Relay(
            db.url, BrokerConfig(AMQP_URL), RelayOptions(batch_size=batch_size), topology
        ) as relay:
            started = time.perf_counter()
            published = relay.drain()
            elapsed = time.perf_counter() - started
        assert published == count, f"relayed {published} of {count}"
    finally:
        db.drop()
        with Connection(AMQP_URL) as conn:
            topology.queue(DESTINATION)(conn.channel()).delete()
    return count / elapsed
