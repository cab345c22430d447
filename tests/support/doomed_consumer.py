"""A consumer that takes one message and dies without acknowledging it.

``python -m tests.support.doomed_consumer URL QUEUE_PREFIX DESTINATION`` takes one message
from the destination's queue, prints its body and ends with ``os._exit``: no ack, no
close, no cleanup, as a process killed at that instant would.
"""

from __future__ import annotations

import os
import sys

from kombu import Consumer, Message

from saga.broker.transport import Topology
from tests.support.brokers import TestBroker


def main(url: str, queue_prefix: str, destination: str) -> None:
    broker = TestBroker(url, "doomed", accepts_message_loss=True)
    queue = Topology(queue_prefix=queue_prefix).queue(destination)
    taken: list[Message] = []
    connection = broker.config.connected()
    consumer = Consumer(
        connection.channel(),
        queues=[queue],
        on_message=taken.append,
        prefetch_count=1,
        accept=["application/json"],
    )
    consumer.consume()
    while not taken:
        try:
            connection.drain_events(timeout=1)
        except TimeoutError:
            continue
    body = taken[0].body
    sys.stdout.write(body.decode() if isinstance(body, bytes) else body)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:4])
