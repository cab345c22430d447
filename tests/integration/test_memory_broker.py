"""kombu's in-memory broker passes the contract every broker passes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from kombu import Consumer, Message

from tests.integration.test_transport_contract import BrokerContract
from tests.support.brokers import TestBroker
from tests.support.wait import wait_until


class TestMemoryBroker(BrokerContract):
    @pytest.fixture
    def broker(self) -> Iterator[TestBroker]:
        broker = TestBroker("memory://", "memory")
        yield broker
        broker.cleanup()

    def take_one_and_die(self, broker: TestBroker, destination: str) -> bytes:
        """Its queues live in this process, so the consumer that dies is a connection
        dropped with the message unacknowledged."""
        broker.use(destination)
        taken: list[Message] = []
        connection = broker.config.connected()
        Consumer(
            connection.channel(),
            queues=[broker.topology.queue(destination)],
            on_message=taken.append,
            accept=["application/json"],
        ).consume()

        def took() -> bool:
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=0.1)
            return bool(taken)

        wait_until(took, what="the doomed consumer's message")
        connection.release()
        body = taken[0].body
        return body.encode() if isinstance(body, str) else bytes(body)
