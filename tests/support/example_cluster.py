"""The order-saga example on test databases, its services in threads or subprocesses."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from saga.cli.loading import load_service
from saga.consumers import ConsumerOptions, ServiceRunner
from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import SERVICES, Cluster
from saga.examples.order_saga.gateway import GatewayClient, GatewayServer
from saga.examples.order_saga.processes import SagaProcess
from tests.rig.supervisor import Supervisor
from tests.support.brokers import TestBroker
from tests.support.databases import DatabaseFactory, TestDatabase
from tests.support.running import running_relay, stop_runner
from tests.support.wait import wait_until


def make_cluster(factory: DatabaseFactory, broker: TestBroker) -> tuple[Cluster, list[str]]:
    databases = {service: factory.create() for service in SERVICES}
    broker.use(*SERVICES)
    system = Cluster(
        {s: d.url for s, d in databases.items()},
        broker.url,
        broker.topology.queue_prefix,
        extra_env={"SAGA_SIDE_EFFECT_LEASE": "2"},  # a crashed call is taken over quickly
    )
    system.prepare()
    return system, [d.name for d in databases.values()]


def gateway_answers(gateway: GatewayClient) -> bool:
    """True once the fake payment gateway answers."""
    try:
        gateway.calls()
    except OSError:
        return False
    return True


@contextmanager
def gateway_running(system: Cluster) -> Iterator[GatewayServer]:
    """The fake payment gateway in a thread, where this process's payments handlers find it."""
    server = GatewayServer(system.gateway_port).start()
    previous = os.environ.get("PAYMENT_GATEWAY_URL")
    os.environ["PAYMENT_GATEWAY_URL"] = server.url
    try:
        yield server
    finally:
        server.stop()
        if previous is None:
            os.environ.pop("PAYMENT_GATEWAY_URL", None)
        else:
            os.environ["PAYMENT_GATEWAY_URL"] = previous


@contextmanager
def services_in_threads(system: Cluster, broker: TestBroker, **options: object) -> Iterator[None]:
    """The gateway, and a relay and a consumer per service, as threads of this process."""
    from saga.examples.order_saga.cluster import TARGETS

    with ExitStack() as stack:
        stack.enter_context(gateway_running(system))
        for service in system.services:
            db = TestDatabase(system.database_urls[service], service)
            stack.enter_context(running_relay(db, broker))
            runner = ServiceRunner(
                load_service(TARGETS[service]),
                system.database_urls[service],
                broker.config,
                ConsumerOptions(**options),  # type: ignore[arg-type]
                broker.topology,
            )
            runner.start()
            stack.callback(stop_runner, runner)
            assert runner.wait_ready(30)
        yield


@contextmanager
def services_as_processes(system: Cluster, log_dir: Path) -> Iterator[list[SagaProcess]]:
    """``saga relay`` and ``saga consume`` per service, as real subprocesses."""
    processes = [SagaProcess(args, env, log_dir, name) for name, args, env in system.commands()]
    try:
        yield processes
    finally:
        codes = {p.name: p.terminate(60) for p in processes}
        failed = {n: c for n, c in codes.items() if c != 0}
        assert not failed, {
            n: next(p for p in processes if p.name == n).output()[-3000:] for n in failed
        }


def settle(
    system: Cluster, supervisor: Supervisor, sagas: int, timeout: float = 120
) -> dict[str, int]:
    """Wait, restarting what dies, until ``sagas`` finished and every outbox is drained."""

    def settled() -> bool:
        supervisor.watch()
        return workload.quiescent(system, sagas)

    wait_until(settled, timeout, interval=0.2, what=f"{sagas} sagas settled, outboxes drained")
    return workload.status_counts(system)
