"""What a broker can do, in one object: the relay, the consumers, the CLI and the
dashboard ask it, never the broker URL's scheme (see docs/brokers.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The features a broker offers; a feature it lacks is done without, or refused."""

    #: One acknowledgement settles every earlier delivery of the channel (AMQP
    #: ``basic.ack`` with ``multiple``); without it each delivery is acked alone.
    multiple_ack: bool
    #: The client must read and send heartbeats on an idle connection.
    heartbeats: bool
    #: The broker confirms each message once it holds it (AMQP publisher confirms): a
    #: batch is published, then every confirm is awaited at once, and a row counts as
    #: published only once its message is acked; without it a batch goes in one call
    #: (a Redis pipeline, one PostgreSQL INSERT).
    confirmed_publish: bool
    #: A command for a queue that does not exist is handed back to the publisher
    #: (``on_return``), so the relay keeps its row; without it the broker keeps the
    #: message under the queue's name until the queue is declared.
    returns_unroutable: bool
    #: An event no queue subscribes to is handed back to the publisher, which counts it
    #: as unrouted (``saga stats``); without it such an event goes unnoticed.
    returns_unrouted_events: bool
    #: Events can be published to subscribers: bindings are shared by every process
    #: and outlive a restart (see docs/events.md).
    events: bool
    #: The broker tells each queue's messages by state (ready, in flight, delayed) and
    #: the oldest one's age; without it, only the messages ready.
    queue_details: bool
    #: A message published with an ``x-delay`` header (milliseconds) is delivered
    #: only after that delay.
    delayed_delivery: bool
    #: The broker keeps its bindings in a table that can be listed (``saga subscriptions``).
    routing_table: bool
