"""Running relays and services in threads of the test process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from consumers import ConsumerOptions, Service, ServiceRunner
from outbox_relay import Relay, RelayOptions
from saga.observability.metrics import Metrics
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase


@contextmanager
def running_service(
    service: Service,
    db: TestDatabase,
    broker: TestBroker,
    metrics: Metrics | None = None,
    **options: object,
) -> Iterator[ServiceRunner]:
    broker.use(service.name)
    runner = ServiceRunner(
        service,
        db.url,
        broker.config,
        ConsumerOptions(**options),  # type: ignore[arg-type]
        broker.topology,
        metrics=metrics,
    )
    runner.start()
    try:
        assert runner.wait_ready(30), "service did not start consuming"
        yield runner
    finally:
        runner.stop(30)


@contextmanager
def running_relay(db: TestDatabase, broker: TestBroker, **options: object) -> Iterator[Relay]:
    relay = Relay(db.url, broker.config, RelayOptions(**options), broker.topology)  # type: ignore[arg-type]
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), name="test-relay")
    thread.start()
    try:
        yield relay
    finally:
        stop.set()
        thread.join(30)
