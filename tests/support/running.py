"""Running relays and services in threads of the test process.

Every helper checks at exit that what it ran did not die: a thread that raised
re-raises its error in the test, and one still alive after the join fails it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from saga import SagaRegistry, Service
from saga.consumers import ConsumerOptions, ServiceRunner
from saga.observability.metrics import Metrics
from saga.outbox_relay import Relay, RelayOptions
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase

JOIN_TIMEOUT = 30.0


class ThreadDied(AssertionError):
    """A relay or service running in a test thread stopped on an error."""


@contextmanager
def in_thread(run: Callable[[threading.Event], object], name: str) -> Iterator[threading.Thread]:
    """``run(stop)`` in a thread until the block ends; its failure fails the test."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def target() -> None:
        try:
            run(stop)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=target, name=name)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(JOIN_TIMEOUT)
        if failures:
            raise ThreadDied(f"{name} died: {failures[0]!r}") from failures[0]
        assert not thread.is_alive(), f"{name} did not stop within {JOIN_TIMEOUT}s"


def stop_runner(runner: ServiceRunner) -> None:
    """Stop ``runner``; a worker that died (or would not stop) fails the test."""
    runner.stop(JOIN_TIMEOUT)
    failure = runner.failure
    if failure is not None:
        raise ThreadDied(f"{runner.service.name} died: {failure!r}") from failure
    alive = [t.name for t in runner._threads if t.is_alive()]
    assert not alive, f"{alive} did not stop within {JOIN_TIMEOUT}s"


@contextmanager
def running_service(
    service: Service,
    db: TestDatabase,
    broker: TestBroker,
    metrics: Metrics | None = None,
    *,
    database_url: str | None = None,
    **options: object,
) -> Iterator[ServiceRunner]:
    """``service`` consuming in threads, on ``db`` (or ``database_url``: the same database
    another way, e.g. through a pooler)."""
    broker.use(service.name)
    runner = ServiceRunner(
        service,
        database_url or db.url,
        broker.config,
        ConsumerOptions(**options),  # type: ignore[arg-type]
        broker.topology,
        metrics=metrics,
    )
    runner.start()
    if not runner.wait_ready(30):
        stop_runner(runner)  # raises the failure that kept it from starting
        raise AssertionError("service did not start consuming within 30s")
    try:
        yield runner
    finally:
        stop_runner(runner)


@contextmanager
def running_relay(
    db: TestDatabase,
    broker: TestBroker,
    *,
    database_url: str | None = None,
    name: str = "test-relay",
    **options: object,
) -> Iterator[Relay]:
    url = database_url or db.url
    relay = Relay(url, broker.config, RelayOptions(**options), broker.topology)  # type: ignore[arg-type]
    with in_thread(relay.run, name):
        yield relay


@contextmanager
def saga_system_running(
    db: TestDatabase, broker: TestBroker, registry: SagaRegistry, *participants: Service
) -> Iterator[None]:
    """A saga's home service (``registry``), its participants and one relay, all on ``db``."""
    with ExitStack() as stack:
        stack.enter_context(running_relay(db, broker))
        stack.enter_context(running_service(registry.as_service(), db, broker))
        for participant in participants:
            stack.enter_context(running_service(participant, db, broker))
        yield
