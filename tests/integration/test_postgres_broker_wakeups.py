"""The PostgreSQL broker's wake-ups (docs/operations.md): a publisher notifies a queue at
most once per :data:`WAKE_INTERVAL`, after its commit; an idle consumer polls with a wait
that doubles from :data:`MIN_POLL` to :data:`MAX_POLL`, and a ``NOTIFY`` for its queue
ends the wait at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from kombu import Connection, Consumer, Message, Producer
from psycopg import sql

from saga.broker.postgres import transport as postgres_transport
from saga.broker.postgres.transport import (
    DEFAULT_SCHEMA,
    MAX_POLL,
    MIN_POLL,
    WAKE_INTERVAL,
    wake_channel,
)
from tests.support.brokers import TestBroker
from tests.support.wait import wait_until

END = "end of test"


def _publisher(broker: TestBroker, conn: Connection) -> Callable[[str], None]:
    producer = Producer(conn.channel())

    def publish(destination: str) -> None:
        producer.publish({"to": destination}, exchange="",
                         routing_key=broker.topology.queue_name(destination))  # fmt: skip

    return publish


def _notices(listener: psycopg.Connection[Any]) -> list[str]:
    """Every notice on the wake channel up to the test's own last one (sent after the rest
    committed, so delivered after them)."""
    listener.execute("SELECT pg_notify(%s, %s)", (wake_channel(DEFAULT_SCHEMA), END))
    payloads: list[str] = []
    for notice in listener.notifies(timeout=30):
        if notice.payload == END:
            return payloads
        payloads.append(notice.payload)
    raise AssertionError(f"the test's own notice never came; got {payloads}")


def test_a_publisher_notifies_a_queue_at_most_once_per_wake_interval(
    pg_broker: TestBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    monkeypatch.setattr(postgres_transport, "monotonic", lambda: now[0])
    for destination in ("a", "b"):
        pg_broker.declare(destination)
    a, b = (pg_broker.topology.queue_name(d) for d in ("a", "b"))
    with psycopg.connect(pg_broker.url, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(wake_channel(DEFAULT_SCHEMA))))
        with Connection(pg_broker.url) as conn:
            publish = _publisher(pg_broker, conn)
            for _ in range(20):
                publish("a")  # the same instant: one notice
            publish("b")  # another queue: its own notice
            now[0] = WAKE_INTERVAL / 2
            publish("a")  # too soon after the last notice for a
            now[0] = WAKE_INTERVAL
            publish("a")  # one interval later
        notices = [n for n in _notices(listener) if n in (a, b)]
    assert notices == [a, b, a]
    assert pg_broker.queue_depth("a") == 22 and pg_broker.queue_depth("b") == 1


def test_an_idle_consumer_backs_off_to_max_poll_and_a_notify_wakes_it(
    pg_broker: TestBroker,
) -> None:
    pg_broker.declare("idle")
    waits: list[tuple[float, bool]] = []
    received: list[Any] = []
    with Connection(pg_broker.url) as conn:
        conn.connect()
        transport = conn.transport
        real_wait = transport._wait

        def recorded(seconds: float) -> bool:
            woken = bool(real_wait(seconds))
            waits.append((seconds, woken))
            return woken

        transport._wait = recorded

        def take(body: Any, message: Message) -> None:
            received.append(body)
            message.ack()

        queue = pg_broker.topology.queue("idle")
        with Consumer(conn.channel(), queues=[queue], callbacks=[take]):

            def consume() -> None:
                while not received:
                    conn.drain_events(timeout=60)

            consumer = threading.Thread(target=consume, name="idle consumer")
            consumer.start()
            wait_until(lambda: (MAX_POLL, False) in waits, timeout=60, what="a wait of MAX_POLL")
            pg_broker.publish_raw("idle", b'{"n": 1}', "application/json")
            consumer.join(60)
    assert received == [{"n": 1}]
    doubling = [MIN_POLL * 2**k for k in range(8)]  # 5 ms ... 640 ms, then MAX_POLL
    assert [seconds for seconds, _ in waits[: len(doubling) + 1]] == [*doubling, MAX_POLL]
    assert all(seconds == MAX_POLL for seconds, _ in waits[len(doubling) : -1])
    assert not any(woken for _, woken in waits[:-1])
    assert waits[-1] == (MAX_POLL, True)  # the NOTIFY ended the wait: no poll found it
