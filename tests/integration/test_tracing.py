"""Tracing on the real path: one trace per saga, its spans named and attributed.

The order-saga example runs as it does in production, only in threads of this
process: a relay per service publishes outbox rows to RabbitMQ, a consumer per
service takes them from there. An OpenTelemetry SDK records every span.
"""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import SUBSCRIBERS, Cluster
from saga.examples.order_saga.orders import create_order
from saga.observability import tracing
from tests.support.brokers import TestBroker
from tests.support.example_cluster import services_in_threads
from tests.support.wait import wait_until

EXPORTER = InMemorySpanExporter()

#: (span name, saga.step) from the saga's start to its end, each span the parent of the next.
COMPLETED = [
    ("saga create_order start", None),
    ("inventory handle ReserveStock", "reserve_stock"),
    ("orders handle StockReserved", "reserve_stock"),
    ("customers handle ReserveCredit", "reserve_credit"),
    ("orders handle CreditReserved", "reserve_credit"),
    ("payments handle ChargeCard", "charge_payment"),
    ("orders handle CardCharged", "charge_payment"),
    ("inventory handle ScheduleShipment", "schedule_shipment"),
    ("orders handle ShipmentScheduled", "schedule_shipment"),
]
DECLINED = [
    *COMPLETED[:6],
    ("orders handle saga.FailureReply", "charge_payment"),
    ("customers handle ReleaseCredit", "reserve_credit"),
    ("orders handle saga.Ack", "reserve_credit"),
    ("inventory handle ReleaseStock", "reserve_stock"),
    ("orders handle saga.Ack", "reserve_stock"),
]
#: The events the saga's last local step publishes, handled by their subscribers in spans
#: whose parent is the span that published them (the chain's last).
EVENT_SPANS = {
    "completed": ["analytics handle OrderApproved", "notifications handle OrderApproved"],
    "compensated": ["notifications handle OrderRejected"],
}


@pytest.fixture(scope="module", autouse=True)
def _sdk() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)


@pytest.fixture
def running(order_system: Cluster, rabbit: TestBroker) -> Iterator[Cluster]:
    with services_in_threads(order_system, rabbit):
        yield order_system


@pytest.mark.parametrize(
    ("payment_failure", "status", "expected"),
    [(0.0, "completed", COMPLETED), (1.0, "compensated", DECLINED)],
    ids=["completed", "card-declined"],
)
def test_a_saga_is_one_trace_of_attributed_spans(
    running: Cluster, payment_failure: float, status: str, expected: list[tuple[str, str | None]]
) -> None:
    EXPORTER.clear()
    (order,) = workload.make_orders(1, workload.FailureRates(0, 0, payment_failure, 0))
    with running.connect("orders") as conn:
        saga_id = create_order.start(conn, order, idempotency_key=order.order_id)
    wait_until(lambda: _status(running, saga_id) == status, 60, what=f"saga {status}")
    events = wait_until(
        lambda: len(found := _event_spans()) >= len(EVENT_SPANS[status]) and found,
        30,
        what="the events' spans",
    )
    chain = wait_until(
        lambda: len(spans := _the_trace()) >= len(expected) and spans, 10, what="spans"
    )

    assert [s.name for s in chain] == [name for name, _ in expected]
    assert sorted(s.name for s in events) == EVENT_SPANS[status]
    assert {s.parent.span_id for s in events if s.parent} == {chain[-1].context.span_id}
    start, *handled = chain
    assert _attributes(start) == {tracing.SAGA_ID: str(saga_id), tracing.SAGA_NAME: "create_order"}
    assert [_attributes(s).get(tracing.SAGA_STEP) for s in chain] == [s for _, s in expected]
    for span in handled:
        consumer, _, message_type = span.name.split(" ")
        attributes = _attributes(span)
        assert span.kind is trace.SpanKind.CONSUMER
        assert attributes[tracing.SAGA_ID] == str(saga_id)
        assert attributes[tracing.MESSAGE_TYPE] == message_type
        assert UUID(str(attributes[tracing.MESSAGE_ID]))
        assert attributes[tracing.CONVERSATION_ID] == str(saga_id)
        assert attributes[tracing.DESTINATION] == attributes[tracing.CONSUMER_GROUP] == consumer
        assert attributes[tracing.OPERATION_TYPE] == "process"
    message_ids = [_attributes(s)[tracing.MESSAGE_ID] for s in handled]
    assert len(set(message_ids)) == len(message_ids)


def _status(system: Cluster, saga_id: UUID) -> str | None:
    with system.connect("orders") as conn:
        row = conn.execute(
            "SELECT status FROM saga.saga_instances WHERE id = %s", (saga_id,)
        ).fetchone()
    return row[0] if row else None


def _attributes(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def _event_spans() -> list[ReadableSpan]:
    """The spans of the services that subscribe to orders' events."""
    return [s for s in EXPORTER.get_finished_spans() if s.name.split(" ")[0] in SUBSCRIBERS]


def _the_trace() -> list[ReadableSpan]:
    """Every span recorded but the events', root first, each the parent of the next.

    Fails unless they form one such chain: one trace, every message handled in a
    span whose parent is the span that sent it.
    """
    spans = [s for s in EXPORTER.get_finished_spans() if s not in _event_spans()]
    (root,) = [s for s in spans if s.parent is None]
    child_of = {s.parent.span_id: s for s in spans if s.parent is not None}
    assert len(child_of) == len(spans) - 1, "a span with two children"
    chain = [root]
    while (context := chain[-1].context) and context.span_id in child_of:
        chain.append(child_of[context.span_id])
    assert len(chain) == len(spans), "spans outside the saga's chain"
    return chain
