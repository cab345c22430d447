"""Events in memory: what ``subscribe`` declares and what ``ctx.publish`` sends."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from saga import HandlerContext, Service
from saga.broker.transport import Topology, check_events_supported
from saga.errors import ConfigurationError, EventsNotSupported
from saga.messaging.envelope import Envelope
from saga.messaging.outbox import Outbox, OutgoingMessage


class OrderApproved(BaseModel):
    order_id: str


class ShipIt(BaseModel):
    order_id: str


def test_subscribe_registers_a_handler_and_a_binding() -> None:
    service = Service("notifications")

    @service.subscribe(OrderApproved)
    def notify(tx: object, event: OrderApproved, ctx: object) -> None: ...

    @service.handler(ShipIt)
    def ship(tx: object, command: ShipIt, ctx: object) -> None: ...

    assert service.subscriptions == ["OrderApproved"]  # commands bind nothing
    assert service.message_types == ["OrderApproved", "ShipIt"]
    assert "subscriptions=['OrderApproved']" in repr(service)
    with pytest.raises(ConfigurationError, match="already has a handler"):
        service.add_subscription(OrderApproved, notify)


def test_ctx_publish_sends_an_event_with_no_destination_in_the_conversation() -> None:
    cause = Envelope.wrap(ShipIt(order_id="o1"), reply_to="orders")
    ctx = HandlerContext(cause, "shipping")
    event_id = ctx.publish(OrderApproved(order_id="o1"))
    (sent,) = ctx.outgoing
    assert sent.is_event and sent.destination is None
    assert sent.envelope.message_id == event_id
    assert sent.envelope.causation_id == cause.message_id
    assert sent.envelope.correlation_id == cause.correlation_id
    assert sent.envelope.reply_to is None  # nobody waits for an answer to an event
    assert ctx.replies == []  # not kept to answer a duplicate: it was published once


def test_an_event_row_has_no_destination_and_a_command_row_a_checked_one() -> None:
    outbox = Outbox()
    event, command = outbox.rows(
        [
            OutgoingMessage(Envelope.wrap(OrderApproved(order_id="o1")), None),
            OutgoingMessage(Envelope.wrap(ShipIt(order_id="o1")), "shipping"),
        ]
    )
    assert (event[1], event[2]) == (None, "OrderApproved")
    assert (command[1], command[2]) == ("shipping", "ShipIt")


def test_the_events_exchange_follows_the_queue_prefix() -> None:
    assert Topology().events_exchange_name == "saga.events"
    exchange = Topology(queue_prefix="t1.").events_exchange()
    assert (exchange.name, exchange.type, exchange.durable) == ("t1.events", "direct", True)


def test_redis_is_refused_for_events_and_rabbitmq_postgresql_are_not() -> None:
    from kombu import Connection

    for url in ("amqp://guest@localhost//", "memory://", "postgresql://localhost/x"):
        check_events_supported(Connection(url), "test")
    with pytest.raises(EventsNotSupported, match="Redis for commands only"):
        check_events_supported(Connection("redis://localhost:6379/0"), "service 'x'")
