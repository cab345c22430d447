"""Broker access for tests: unique queue names per test, cleaned up afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kombu import Connection, Consumer, Producer

from saga.broker.transport import BrokerConfig, Topology
from tests.support.wait import wait_until


@dataclass(frozen=True)
class RawMessage:
    """Bytes to publish straight to a queue, with the properties a publisher chooses."""

    body: bytes
    content_type: str = "application/json"
    headers: dict[str, Any] = field(default_factory=dict)
    #: The ``content_encoding`` property; by default utf-8 for JSON, binary for the rest.
    content_encoding: str | None = None

    @property
    def encoding(self) -> str:
        if self.content_encoding is not None:
            return self.content_encoding
        return "utf-8" if self.content_type == "application/json" else "binary"


@dataclass
class TestBroker:
    """A broker URL plus a topology whose queues belong to one test only."""

    __test__ = False

    url: str
    kind: str
    topology: Topology = field(
        default_factory=lambda: Topology(queue_prefix=f"t{uuid.uuid4().hex[:10]}.")
    )
    destinations: set[str] = field(default_factory=set)
    #: The shared test Redis runs without persistence: tests that use it accept the risk.
    accepts_message_loss: bool = False

    @property
    def config(self) -> BrokerConfig:
        return BrokerConfig(
            self.url,
            visibility_timeout=5,
            lease=5,
            accept_redis_message_loss=self.accepts_message_loss,
        )

    def use(self, *destinations: str) -> None:
        self.destinations.update(destinations)

    def declare(self, destination: str) -> None:
        self.use(destination)
        with Connection(self.url) as conn:
            self.topology.queue(destination)(conn.channel()).declare()

    def publish_raw(
        self,
        destination: str,
        body: bytes,
        content_type: str,
        headers: dict[str, Any] | None = None,
    ) -> None:
        """Publish bytes straight to a destination's queue, bypassing the outbox."""
        self.publish_many(destination, [body], content_type, headers)

    def publish_many(
        self,
        destination: str,
        bodies: list[bytes],
        content_type: str = "application/json",
        headers: dict[str, Any] | None = None,
    ) -> None:
        """Publish several bodies on one connection, in order."""
        self.publish_each(
            destination, [RawMessage(body, content_type, headers or {}) for body in bodies]
        )

    def publish_each(self, destination: str, messages: list[RawMessage]) -> None:
        """Publish messages, each with its own properties, on one connection, in order."""
        self.use(destination)
        with Connection(self.url) as conn:
            channel = conn.channel()
            self.topology.queue(destination)(channel).declare()
            producer = Producer(channel)
            for message in messages:
                producer.publish(
                    message.body,
                    exchange="",
                    routing_key=self.topology.queue_name(destination),
                    content_type=message.content_type,
                    content_encoding=message.encoding,
                    headers=message.headers,
                    delivery_mode=2,
                )

    def receive(self, destination: str, count: int, timeout: float = 10.0) -> list[Any]:
        """Take up to ``count`` messages from a destination's queue (acked), waiting up to
        ``timeout``; any further message stays in the queue."""
        self.use(destination)
        got: list[Any] = []
        with Connection(self.url) as conn:
            channel = conn.channel()
            queue = self.topology.queue(destination)
            queue(channel).declare()

            def take(message: Any) -> None:
                if len(got) >= count:  # prefetched past the count: leave it in the queue
                    message.requeue()
                    return
                got.append(message)
                message.ack()

            with Consumer(channel, queues=[queue], on_message=take, prefetch_count=count):
                import time

                deadline = time.monotonic() + timeout
                while len(got) < count and time.monotonic() < deadline:
                    try:
                        conn.drain_events(timeout=0.2)
                    except TimeoutError:
                        continue
        return got

    def queue_depth(self, destination: str) -> int:
        """Messages ready in the queue (not those a consumer holds unacknowledged)."""
        return self._declare_ok(destination).message_count

    def depth_once_released(self, destination: str, timeout: float = 30.0) -> int:
        """Ready messages once no consumer is attached: every delivery a stopped consumer
        left unacknowledged is back in the queue by then, so nothing more will turn up."""
        wait_until(
            lambda: self._declare_ok(destination).consumer_count == 0,
            timeout,
            what=f"no consumer left on {destination}",
        )
        return self.queue_depth(destination)

    def _declare_ok(self, destination: str) -> Any:
        with Connection(self.url) as conn:
            channel = conn.channel()
            return self.topology.queue(destination)(channel).queue_declare(passive=False)

    def cleanup(self) -> None:
        try:
            with Connection(self.url) as conn:
                channel = conn.channel()
                for destination in self.destinations:
                    try:
                        self.topology.queue(destination)(channel).delete()
                    except Exception:
                        channel = conn.channel()
                if self.kind == "amqp":
                    self.topology.events_exchange()(channel).delete()
        except Exception:
            pass


def iter_kinds() -> Iterator[str]:
    yield from ("memory", "amqp", "redis", "postgres")
