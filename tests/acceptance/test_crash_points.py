"""The crash-point matrix: each fault point fires once in the running example, then recovery.

Every process of the example runs with the point armed (``SAGA_FAULTS=point@2``);
whichever reaches it a second time kills itself with SIGKILL, the supervisor
starts it again without the fault, and the checker must find nothing lost,
nothing applied twice, every saga finished in order. Every restart must answer
a fault that fired: a process that died of anything else (a real bug, crash
looping under the supervisor) fails the test.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import Cluster
from saga.examples.order_saga.gateway import GatewayClient
from saga.faults import FAULT_POINTS
from tests.rig.checker import check
from tests.rig.supervisor import Supervisor
from tests.support.example_cluster import settle

ORDERS = 40


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_recovery_after_a_crash_at(point: str, order_system: Cluster, tmp_path: Path) -> None:
    orders = workload.make_orders(ORDERS, workload.FailureRates(0.1, 0.1, 0.1, 0.1), prefix=point)
    commands = order_system.commands()
    if point.startswith("relay."):  # consumers publish their own writes: leave all to the relays
        commands = [
            (name, [*args, "--no-publish-after-commit"] if args[0] == "consume" else args, env)
            for name, args, env in commands
        ]
    supervisor = Supervisor(commands, tmp_path, faults=f"{point}@2")
    try:
        workload.submit(order_system, orders, per_transaction=5)
        counts = settle(order_system, supervisor, ORDERS)
        gateway_calls = GatewayClient(order_system.gateway_url).calls()
    finally:
        codes = supervisor.stop()
    assert set(gateway_calls.values()) == {1}, gateway_calls  # no card charged twice
    assert supervisor.fired()[point] >= 1, f"{point} never fired"
    assert set(supervisor.fired()) == {point}, supervisor.fired()
    # A process is armed until the point fires in it once: it dies and is restarted without
    # the fault. A process that reached the point only while stopping died there (-9), with
    # no restart to answer it. So each process's firings are its restarts plus that one.
    killed_while_stopping = {name for name, code in codes.items() if code == -signal.SIGKILL}
    for name, points in supervisor.fired_by_process().items():
        expected = supervisor.restarts[name] + (name in killed_while_stopping)
        assert points.total() == expected <= 1, (name, points, supervisor.deaths, codes)
    assert all(code == -signal.SIGKILL for _, code in supervisor.deaths), supervisor.deaths
    assert counts.get("completed", 0) + counts.get("compensated", 0) == ORDERS, counts
    report = check(order_system)
    assert report.ok, report.violations
    # 0: stopped gracefully; -9: a process still armed reached the point again while
    # stopping (counted above); -15: a process restarted a moment ago, stopped before it
    # set up its handlers
    assert set(codes.values()) <= {0, -9, -15}, codes
