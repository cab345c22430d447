"""The framework's py-amqp transport on RabbitMQ: read-ahead, gathered writes, confirms.

Frames must come out whole and in order whatever their sizes (bodies larger than the
read-ahead buffer and than a frame), a batch's frames must reach the socket in one
write, and a consumer must take many frames per ``recv``. Confirms that do not come in
time end the wait with a transient error.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from kombu import Consumer, Producer
from kombu.message import Message

from saga.broker.amqp.confirms import PublisherConfirms
from saga.broker.amqp.transport import READ_AHEAD, ReadAheadTransport
from saga.broker.reconnect import transient_errors
from saga.errors import PublishNotConfirmed
from saga.outbox_relay.claims import OutboxRow
from saga.outbox_relay.publisher import BatchPublisher
from tests.support.brokers import TestBroker
from tests.support.tcp_proxy import TcpProxy
from tests.support.wait import wait_until

SIZES = [10, 300, READ_AHEAD - 5, READ_AHEAD + 5, 200_000, 1, 4096]


def _rows(destination: str, bodies: list[bytes]) -> list[OutboxRow]:
    return [
        OutboxRow(i, uuid.uuid4(), destination, "Blob", body, 0) for i, body in enumerate(bodies)
    ]


def _counting(transport: ReadAheadTransport, name: str) -> list[int]:
    """Count calls of the transport's socket function ``name`` (``_write``, ``_quick_recv``)."""
    calls: list[int] = []
    real: Callable[..., Any] = getattr(transport, name)

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    setattr(transport, name, counted)
    return calls


def test_frames_of_any_size_arrive_whole_and_in_order(rabbit: TestBroker) -> None:
    rabbit.use("blobs")
    bodies = [bytes([65 + i % 26]) * size for i, size in enumerate(SIZES * 20)]
    with rabbit.config.connect() as conn:
        assert isinstance(conn.connection.transport, ReadAheadTransport)
        publisher = BatchPublisher(conn, rabbit.topology)
        outcome = publisher.publish(_rows("blobs", bodies))
        assert len(outcome.published) == len(bodies) and not outcome.failed
        publisher.close()
    received: list[bytes] = []
    with rabbit.config.connect() as conn:
        queue = rabbit.topology.queue("blobs")

        def take(message: Message) -> None:
            body = message.body
            received.append(body.encode() if isinstance(body, str) else body)
            message.ack()

        with Consumer(conn.channel(), queues=[queue], on_message=take, prefetch_count=50):
            while len(received) < len(bodies):
                conn.drain_events(timeout=10)
    assert received == bodies


def test_a_batch_goes_to_the_socket_in_one_write(rabbit: TestBroker) -> None:
    rabbit.declare("writes")
    with rabbit.config.connect() as conn:
        publisher = BatchPublisher(conn, rabbit.topology)
        publisher.publish(_rows("writes", [b"{}"]))  # channel, confirm.select and declare done
        writes = _counting(conn.connection.transport, "_write")
        outcome = publisher.publish(_rows("writes", [b'{"n": %d}' % i for i in range(50)]))
        assert len(outcome.published) == 50
        assert len(writes) == 1  # the 50 messages' frames; their confirms are only read
        publisher.close()


def test_an_acknowledgement_goes_out_in_the_write_of_the_rows_after_them(
    rabbit: TestBroker,
) -> None:
    """A consumer publishing the rows it wrote acknowledges the delivery it handled in the
    same write (``then``), after the rows' frames: the rows leave first, and one write."""
    rabbit.declare("writes")
    rabbit.publish_many("handled", [b'{"n": 0}'])
    with rabbit.config.connect() as conn:
        publisher = BatchPublisher(conn, rabbit.topology)
        publisher.publish(_rows("writes", [b"{}"]))  # channel, confirm.select and declare done
        delivered: list[Message] = []
        queue = rabbit.topology.queue("handled")
        with Consumer(conn.channel(), queues=[queue], on_message=delivered.append):
            while not delivered:
                conn.drain_events(timeout=10)
            transport = conn.connection.transport
            written: list[bytes] = []
            real = transport._write

            def write(data: bytes) -> None:
                written.append(bytes(data))
                real(data)

            transport._write = write
            outcome = publisher.publish(_rows("writes", [b"{}"] * 3), then=delivered[0].ack)
            transport._write = real
        assert len(outcome.published) == 3
    assert len(written) == 1
    basic_publish, basic_ack = b"\x00\x3c\x00\x28", b"\x00\x3c\x00\x50"
    assert written[0].rindex(basic_publish) < written[0].index(basic_ack)
    assert rabbit.depth_once_released("handled") == 0  # acknowledged
    assert rabbit.depth_once_released("writes") == 4


def test_a_consumer_takes_many_frames_per_receive(rabbit: TestBroker) -> None:
    """All 300 deliveries (900 frames, about 35 KB: under :data:`READ_AHEAD`) are sent to
    the consumer before it reads past its setup: its three setup replies (channel, qos,
    consume) and two or three receives take them all. py-amqp alone reads each frame in
    three receives (2,700); a read-ahead of 4 KiB would need nine for the deliveries."""
    rabbit.publish_many("reads", [b'{"n": %d}' % i for i in range(300)])
    received = 0
    with rabbit.config.connect() as conn:
        conn.connect()
        receives = _counting(conn.connection.transport, "_quick_recv")

        def take(message: Message) -> None:
            nonlocal received
            received += 1
            message.ack()

        queue = rabbit.topology.queue("reads")
        with Consumer(conn.channel(), queues=[queue], on_message=take, prefetch_count=300):
            wait_until(lambda: rabbit.queue_depth("reads") == 0, what="300 sent to the consumer")
            while received < 300:
                conn.drain_events(timeout=10)
            taking = len(receives)
    assert taking <= 6, taking


def test_confirms_that_do_not_come_in_time_end_the_wait_with_a_transient_error(
    rabbit: TestBroker,
) -> None:
    rabbit.declare("late")
    with TcpProxy(rabbit.url) as proxy, replace(rabbit.config, url=proxy.url).connect() as conn:
        channel = conn.channel()
        confirms = PublisherConfirms(channel, timeout=1.0)
        proxy.hold_replies()  # RabbitMQ's acks stay in the proxy
        try:
            Producer(channel).publish(b"{}", routing_key=rabbit.topology.queue_name("late"))
            confirms.published("m-1")
            with pytest.raises(PublishNotConfirmed, match="1 published messages unconfirmed"):
                confirms.wait(conn)
        finally:
            proxy.release()  # the connection's close needs its answer
        assert PublishNotConfirmed in transient_errors(conn)
