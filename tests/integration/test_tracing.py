"""Trace context travels in envelopes: one trace id across a whole example saga."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from examples.order_saga import driver
from examples.order_saga.cluster import TARGETS, Cluster
from saga.observability.tracing import trace_id
from tests.support.brokers import TestBroker
from tests.support.databases import DatabaseFactory
from tests.support.example_cluster import gateway_running, make_cluster
from tests.support.pump import Pump, services_of

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def _sdk() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)


@pytest.fixture
def order_system(database_factory: DatabaseFactory) -> Iterator[Cluster]:
    system, names = make_cluster(database_factory, TestBroker("memory://", "memory"))
    with gateway_running(system):
        yield system
    for name in names:
        database_factory.drop(name)


def test_one_trace_id_in_every_envelope_of_a_saga(order_system: Cluster) -> None:
    EXPORTER.clear()
    (order,) = driver.make_orders(1, driver.FailureRates(0, 0, 0, 0))
    driver.submit(order_system, [order])
    pump = Pump(services_of(order_system, TARGETS))
    assert pump.run() == 8  # four commands, four replies
    assert driver.status_counts(order_system) == {"completed": 1}
    trace_ids = {trace_id(envelope.headers) for envelope in pump.seen}
    assert len(trace_ids) == 1 and None not in trace_ids
    (the_trace,) = trace_ids
    spans = EXPORTER.get_finished_spans()
    handler_spans = [s for s in spans if " handle " in s.name]
    assert len(handler_spans) == 8
    assert {format(s.context.trace_id, "032x") for s in spans} == {the_trace}
    assert any(s.name == "saga create_order start" for s in spans)


def test_a_compensated_saga_keeps_its_trace(order_system: Cluster) -> None:
    (order,) = driver.make_orders(1, driver.FailureRates(0, 0, 1.0, 0))  # card declined
    driver.submit(order_system, [order])
    pump = Pump(services_of(order_system, TARGETS))
    pump.run()
    assert driver.status_counts(order_system) == {"compensated": 1}
    assert len({trace_id(e.headers) for e in pump.seen}) == 1
    assert [e.type for e in pump.seen][-2:] == ["ReleaseStock", "saga.Ack"]
