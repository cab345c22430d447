"""Raw throughput of the PostgreSQL broker: publish + claim + handle nothing + ack.

``python -m bench.pg_broker postgresql://.../db [--messages 20000] [--batch 100]``

One publisher thread inserts batches (``Producer.batch()``, one INSERT per batch, as the
relay publishes) while one consumer connection takes them with prefetch ``--batch`` and
acknowledges each (one fenced DELETE per claimed batch). The figure is messages
published, taken and deleted per second, end to end; the queue is empty at the end.
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(measure(args.url, args.messages, args.batch)))


if __name__ == "__main__":
    main()
