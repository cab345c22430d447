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

#: (span name, saga.step): the saga's start, then the stock (an order of one line) and credit
#: reservations at once, each a branch of the start span: its command handled, then its reply.
START = ("saga create_order start", None)
BRANCHES = {
    "reserve_lines": [
        ("inventory handle ReserveStock", "reserve_lines"),
        ("orders handle StockReserved", "reserve_lines"),
    ],
    "reserve_credit": [
        ("customers handle ReserveCredit", "reserve_credit"),
        ("orders handle CreditReserved", "reserve_credit"),
    ],
}
#: What follows the reply answered last (its span the parent of the next, each in turn).
CHARGE = [("payments handle ChargeCard", "charge_payment")]
COMPLETED = [
    *CHARGE,
    ("orders handle CardCharged", "charge_payment"),
    ("inventory handle ScheduleShipment", "schedule_shipment"),
    ("orders handle ShipmentScheduled", "schedule_shipment"),
]
RELEASES = {
    "reserve_lines": [
        ("inventory handle ReleaseStock", "reserve_lines"),
        ("orders handle saga.Ack", "reserve_lines"),
    ],
    "reserve_credit": [
        ("customers handle ReleaseCredit", "reserve_credit"),
        ("orders handle saga.Ack", "reserve_credit"),
    ],
}


def declined(last: str, first: str) -> list[tuple[str, str | None]]:
    """After a declined card: the reservations released, the one answered last first."""
    return [
        *CHARGE,
        ("orders handle saga.FailureReply", "charge_payment"),
        *RELEASES[last],
        *RELEASES[first],
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
    ("payment_failure", "status"),
    [(0.0, "completed"), (1.0, "compensated")],
    ids=["completed", "card-declined"],
)
def test_a_saga_is_one_trace_of_attributed_spans(
    running: Cluster, payment_failure: float, status: str
) -> None:
    EXPORTER.clear()
    rates = workload.FailureRates(0, 0, payment_failure, 0)
    (order,) = workload.make_orders(1, rates, max_lines=1)
    with running.connect("orders") as conn:
        saga_id = create_order.start(conn, order, idempotency_key=order.order_id)
    wait_until(lambda: _status(running, saga_id) == status, 60, what=f"saga {status}")
    events = wait_until(
        lambda: len(found := _event_spans()) >= len(EVENT_SPANS[status]) and found,
        30,
        what="the events' spans",
    )
    tail = COMPLETED if status == "completed" else declined(*BRANCHES)  # either order: as long
    length = 1 + 4 + len(tail)
    root, children = wait_until(
        lambda: sum(map(len, (tree := _the_trace())[1].values())) + 1 >= length and tree,
        10,
        what="spans",
    )

    assert _named([root]) == [START]
    # each reservation is a branch of the start span: its command's span, its reply's, and,
    # from the reply answered last, the rest of the saga, each span the parent of the next
    branches = {
        str(_attributes(span)[tracing.SAGA_STEP]): _chain(children, span)
        for span in children[root.context.span_id]
    }
    assert {step: _named(chain[:2]) for step, chain in branches.items()} == BRANCHES
    (last,) = [step for step, chain in branches.items() if len(chain) > 2]
    (first,) = set(BRANCHES) - {last}
    expected = COMPLETED if status == "completed" else declined(last, first)
    assert _named(branches[last][2:]) == expected
    assert len(branches[first]) == 2
    assert sorted(s.name for s in events) == EVENT_SPANS[status]
    assert {s.parent.span_id for s in events if s.parent} == {branches[last][-1].context.span_id}
    start, handled = root, [*branches[first], *branches[last]]
    assert _attributes(start) == {tracing.SAGA_ID: str(saga_id), tracing.SAGA_NAME: "create_order"}
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


def _the_trace() -> tuple[ReadableSpan, dict[int, list[ReadableSpan]]]:
    """The root of every span recorded but the events', and each span's children.

    Fails unless they form one tree: one trace, every message handled in a span whose
    parent is the span that sent it.
    """
    spans = [s for s in EXPORTER.get_finished_spans() if s not in _event_spans()]
    (root,) = [s for s in spans if s.parent is None]
    ids = {s.context.span_id for s in spans if s.context}
    children: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        if span.parent is not None:
            assert span.parent.span_id in ids, "a span outside the saga's trace"
            children.setdefault(span.parent.span_id, []).append(span)
    return root, children


def _chain(children: dict[int, list[ReadableSpan]], span: ReadableSpan) -> list[ReadableSpan]:
    """``span`` and its descendants, each the only child of the one before."""
    chain = [span]
    while (context := chain[-1].context) and (below := children.get(context.span_id)):
        assert len(below) == 1, f"{chain[-1].name} has {len(below)} children"
        chain.append(below[0])
    return chain


def _named(spans: list[ReadableSpan]) -> list[tuple[str, object]]:
    """(span name, saga.step) of each of ``spans``."""
    return [(s.name, _attributes(s).get(tracing.SAGA_STEP)) for s in spans]
