"""Issue 22's acceptance: the order example on Redis, Redis restarted under it.

Every service (four consumers, their relays, the payment gateway) is a real ``saga``
subprocess on a private ``redis-server`` (never the shared one). With persistence, a
restart loses nothing and every saga finishes with no operator action. Without it
(the risk accepted explicitly), the restart loses commands and replies that Redis
held, and ONE ``saga resume --stuck-after`` brings every stranded saga to its end,
each effect applied once. That a relay and a consumer refuse a Redis without
persistence by default is tested in ``tests/integration/test_broker_durability.py``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import Cluster
from saga.examples.order_saga.gateway import GatewayClient
from saga.examples.order_saga.processes import SagaProcess
from tests.rig.checker import check
from tests.rig.redis_server import RedisServer
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import DatabaseFactory
from tests.support.example_cluster import make_cluster
from tests.support.wait import wait_until

RATES = workload.FailureRates(0.05, 0.05, 0.05, 0.05)  # some orders compensate


@pytest.fixture
def redis_system(
    database_factory: DatabaseFactory, private_redis: Callable[..., RedisServer]
) -> Iterator[Callable[[bool], tuple[Cluster, RedisServer]]]:
    """The order example on fresh databases and a private Redis, with or without persistence."""
    made: list[str] = []

    def make(persistent: bool) -> tuple[Cluster, RedisServer]:
        server = private_redis(persistent=persistent)
        broker = TestBroker(server.url, "redis", accepts_message_loss=not persistent)
        system, names = make_cluster(database_factory, broker)
        made.extend(names)
        system.extra_env["SAGA_REDIS_VISIBILITY_TIMEOUT"] = "10"
        if not persistent:
            system.extra_env["SAGA_ACCEPT_REDIS_MESSAGE_LOSS"] = "true"
        return system, server

    yield make
    for name in made:
        database_factory.drop(name)


class Processes:
    """The example's processes, started and stopped by name (``orders``, ``orders-relay``...)."""

    def __init__(self, system: Cluster, log_dir: Path) -> None:
        self.commands = {name: (args, env) for name, args, env in system.commands()}
        self.log_dir = log_dir
        self.running: dict[str, SagaProcess] = {}

    def start(self, *names: str) -> None:
        for name in names:
            args, env = self.commands[name]
            self.running[name] = SagaProcess(args, env, self.log_dir, name)

    def stop(self, *names: str) -> None:
        """SIGTERM to all of them first, so that they shut down side by side."""
        stopping = {name: self.running.pop(name) for name in names}
        for process in stopping.values():
            if process.returncode is None:
                process.proc.send_signal(signal.SIGTERM)
        codes = {name: process.wait(60) for name, process in stopping.items()}
        assert not any(codes.values()), codes


@contextmanager
def processes(system: Cluster, log_dir: Path) -> Iterator[Processes]:
    started = Processes(system, log_dir)
    try:
        yield started
    finally:
        started.stop(*list(started.running))


def _settled(system: Cluster, sagas: int) -> None:
    wait_until(lambda: workload.quiescent(system, sagas), 90, 0.2, f"{sagas} sagas finished")


def _checked(system: Cluster) -> dict[str, int]:
    """The checker (the gateway's money included) passes; its figures."""
    report = check(system, GatewayClient(system.gateway_url).state())
    assert report.ok, report.violations[:10]
    assert report.figures.get("commands_lost", 0) == 0
    assert report.figures.get("effects_duplicated", 0) == 0
    return report.figures


def _count(system: Cluster, service: str, query: str) -> int:
    with system.connect(service) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def test_a_persistent_redis_restarted_mid_run_loses_nothing(
    redis_system: Callable[[bool], tuple[Cluster, RedisServer]], tmp_path: Path
) -> None:
    system, server = redis_system(True)
    with processes(system, tmp_path) as running:
        running.start(*running.commands)
        workload.submit(system, workload.make_orders(150, RATES, seed=3, prefix="a"))
        wait_until(
            lambda: (
                sum(workload.status_counts(system).get(s, 0) for s in ("completed", "compensated"))
                >= 20
            ),
            60,
            0.1,
            "sagas finishing before the restart",
        )
        server.restart()  # SIGKILL: whatever Redis held must come back from its append-only file
        workload.submit(system, workload.make_orders(150, RATES, seed=4, prefix="b"))
        _settled(system, 300)
        _checked(system)
    assert set(workload.status_counts(system)) <= {"completed", "compensated"}


def test_a_volatile_redis_loses_messages_and_one_bulk_resume_finishes_every_saga(
    redis_system: Callable[[bool], tuple[Cluster, RedisServer]], tmp_path: Path
) -> None:
    system, server = redis_system(False)
    with processes(system, tmp_path) as running:
        running.start("orders-relay", "inventory-relay", "inventory")
        # 30 orders: inventory reserves the stock of each line; its replies wait in Redis
        first = workload.make_orders(30, RATES, seed=5, prefix="r")
        lines = sum(len(order.lines) for order in first)
        workload.submit(system, first)
        wait_until(
            lambda: (
                _count(system, "inventory", "SELECT count(*) FROM saga.inbox") == lines
                and _count(system, "inventory", "SELECT count(*) FROM saga.outbox") == 0
            ),
            60,
            0.1,
            f"{lines} stock reservations (30 orders) replied to",
        )
        running.stop("inventory")
        # 30 more: their first commands wait in Redis for inventory
        workload.submit(system, workload.make_orders(30, RATES, seed=6, prefix="c"))
        wait_until(
            lambda: _count(system, "orders", "SELECT count(*) FROM saga.outbox") == 0,
            60,
            0.1,
            "30 commands handed to Redis",
        )
        server.restart()  # no persistence: 30 replies and 30 commands are gone
        others = [name for name in running.commands if name not in running.running]
        running.start(*others)  # every other service and relay, the gateway
        assert workload.status_counts(system) == {"running": 60}
        resumed = saga_cli(
            system.database_urls["orders"], "resume", "--stuck-after", "0s", "--reason", "redis"
        )
        assert resumed.returncode == 0, resumed.stderr
        assert "resumed 60 saga(s)" in resumed.stdout
        _settled(system, 60)
        figures = _checked(system)
    assert set(workload.status_counts(system)) <= {"completed", "compensated"}
    print(f"\nfigures after one bulk resume: {figures}")
