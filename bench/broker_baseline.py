"""The ceiling for the relay: raw kombu publishes to the same RabbitMQ, no database."""

from __future__ import annotations

import time

from kombu import Connection, Producer, Queue

from bench.environment import AMQP_URL

BODY = b'{"message_id":"00000000-0000-7000-8000-000000000000","type":"Bench","payload":{"n":1}}'


def _queue(conn: Connection, name: str) -> Queue:
    queue = Queue(name, durable=True)
    bound = queue(conn.channel())
    bound.declare()
    bound.purge()
    return queue


def publish_rate(count: int, mode: str, batch: int = 500) -> float:
    """Durable publishes per second: mode is 'confirm' (one confirm each), 'tx' or 'none'."""
    name = f"bench.baseline.{mode}"
    options = {"confirm_publish": True} if mode == "confirm" else {}
    with Connection(AMQP_URL, transport_options=options) as conn:
        queue = _queue(conn, name)
        channel = conn.channel()
        if mode == "tx":
            channel.tx_select()
        producer = Producer(channel)
        started = time.perf_counter()
        for i in range(count):
            producer.publish(
                BODY,
                exchange="",
                routing_key=name,
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=2,
                mandatory=True,
            )
            if mode == "tx" and (i + 1) % batch == 0:
                channel.tx_commit()
        if mode == "tx":
            channel.tx_commit()
        elapsed = time.perf_counter() - started
        queue(conn.channel()).delete()
    return count / elapsed
