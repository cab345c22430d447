"""The PostgreSQL broker alone: raw throughput and idle commit-to-consume latency.

``python -m bench.pg_broker postgresql://.../db [--messages 20000] [--batch 100]``

Throughput (:func:`measure`): one publisher thread inserts batches (``Producer.batch()``,
one INSERT per batch, as the relay publishes) while one consumer connection takes them
with prefetch ``--batch`` and acknowledges each (one fenced DELETE per claimed batch).
The figure is messages published, taken and deleted per second, end to end; the queue
is empty at the end.

Latency (:func:`idle_latency`): an idle consumer, then one message at a time, each
published (its INSERT committed, then the wake-up sent) only after the previous one
arrived and a pause has let the consumer fall back to waiting: from the publisher's clock
before the INSERT to the consumer's callback, on the same machine's monotonic clock.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid

from kombu import Consumer, Producer
from kombu.message import Message

from saga.broker.transport import BrokerConfig, Topology


def measure(url: str, messages: int, batch: int) -> dict[str, float]:
    config = BrokerConfig(url)
    queue = Topology(queue_prefix=f"bench{uuid.uuid4().hex[:8]}.").queue("raw")
    body = json.dumps({"payload": "x" * 200})

    def publish() -> None:
        with config.connect() as conn:
            producer = Producer(conn.channel())
            for start in range(0, messages, batch):
                with producer.batch(max_size=batch):
                    for _ in range(min(batch, messages - start)):
                        producer.publish(
                            body,
                            exchange="",
                            routing_key=queue.name,
                            content_type="application/json",
                        )

    received = 0

    def on_message(message: Message) -> None:
        nonlocal received
        received += 1
        message.ack()

    with config.connect() as conn:
        channel = conn.channel()
        Consumer(channel, queues=[queue], on_message=on_message, prefetch_count=batch).consume()
        started = time.perf_counter()
        publisher = threading.Thread(target=publish)
        publisher.start()
        while received < messages:
            try:
                conn.drain_events(timeout=1)
            except TimeoutError:
                continue
        channel.flush_acks()
        elapsed = time.perf_counter() - started
        publisher.join()
        left = queue(channel).queue_declare().message_count
    return {
        "messages": messages,
        "seconds": round(elapsed, 3),
        "msg_per_s": round(messages / elapsed),
        "left": left,
    }


def idle_latency(url: str, samples: int = 200, pause: float = 0.05) -> dict[str, float]:
    """Commit-to-consume latency of an idle queue, in milliseconds (p50, p99, max)."""
    config = BrokerConfig(url)
    queue = Topology(queue_prefix=f"bench{uuid.uuid4().hex[:8]}.").queue("idle")
    arrived = threading.Event()
    latencies: list[float] = []
    stop = threading.Event()

    def on_message(message: Message) -> None:
        latencies.append(time.monotonic() - float(message.payload["sent"]))
        message.ack()
        arrived.set()

    def consume() -> None:
        with config.connect() as conn:
            Consumer(conn.channel(), queues=[queue], on_message=on_message).consume()
            while not stop.is_set():
                try:
                    conn.drain_events(timeout=0.5)
                except TimeoutError:
                    continue

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        with config.connect() as conn:
            producer = Producer(conn.channel())
            queue(conn.channel()).declare()
            for _ in range(samples):
                arrived.clear()
                stop.wait(pause)  # the consumer goes back to waiting for a wake-up
                producer.publish({"sent": time.monotonic()}, exchange="", routing_key=queue.name)
                if not arrived.wait(30):
                    raise RuntimeError("a message published to an idle queue never arrived")
    finally:
        stop.set()
        consumer.join()
    ordered = sorted(latencies)
    return {
        "samples": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(measure(args.url, args.messages, args.batch)))
    print(json.dumps(idle_latency(args.url)))


if __name__ == "__main__":
    main()
