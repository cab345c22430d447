"""The order saga example with every service a real ``saga`` subprocess on RabbitMQ."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import Cluster
from saga.examples.order_saga.gateway import GatewayClient
from tests.rig.checker import check
from tests.support.cli import saga_cli
from tests.support.example_cluster import services_as_processes

ORDERS = 1000


@pytest.fixture
def order_system(order_system: Cluster) -> Cluster:
    order_system.extra_env["ORDER_SAGA_FLAKINESS"] = "0.03"  # transient failures, retried
    return order_system


def test_thousand_orders_with_failures_at_every_step(order_system: Cluster, tmp_path: Path) -> None:
    orders = workload.make_orders(ORDERS, workload.FailureRates(0.08, 0.08, 0.08, 0.08), seed=11)
    with services_as_processes(order_system, tmp_path):
        workload.submit(order_system, orders)
        counts = workload.wait_until_settled(order_system, ORDERS, timeout=400)
        gateway = GatewayClient(order_system.gateway_url).state()
    assert counts.get("completed", 0) + counts.get("compensated", 0) == ORDERS, counts
    report = check(order_system, gateway)  # the full checker, not only the business invariants
    assert report.ok, report.violations[:10]
    reasons = dict(
        order_system.connect("orders")
        .execute(
            "SELECT split_part(last_error, ':', 1), count(*) FROM saga.saga_instances "
            "WHERE status = 'compensated' GROUP BY 1"
        )
        .fetchall()
    )
    failed_steps = {reason.split("[")[0] for reason in reasons}  # reserve_lines[2]: an item
    assert failed_steps == {
        "reserve_lines",
        "reserve_credit",
        "charge_payment",
        "schedule_shipment",
    }
    print(f"\n{counts}; compensated by step: {reasons}; figures: {report.figures}")

    # saga show: a compensated saga's failed step, then each compensation in reverse order
    # (a saga that failed past the group: every step before it has its forward success)
    ((saga_id,),) = (
        order_system.connect("orders")
        .execute(
            "SELECT id FROM saga.saga_instances WHERE status = 'compensated' "
            "AND last_error LIKE 'charge_payment:%' ORDER BY started_at LIMIT 1"
        )
        .fetchall()
    )
    shown = saga_cli(order_system.database_urls["orders"], "show", str(saga_id), "--json")
    assert shown.returncode == 0, shown.stderr
    timeline = json.loads(shown.stdout)["timeline"]
    failed = [
        i for i, s in enumerate(timeline) if s["outcome"] == "failed" and s["phase"] == "forward"
    ]
    assert failed, timeline
    forward_done = [s["step"] for s in timeline[: failed[-1]] if s["outcome"] == "succeeded"]
    compensated = [s["step"] for s in timeline[failed[-1] + 1 :] if s["outcome"] == "succeeded"]
    one_entry_a_step = [step for step, _ in itertools.groupby(compensated)]  # a line each
    assert one_entry_a_step == list(reversed(forward_done))
    table = saga_cli(order_system.database_urls["orders"], "show", str(saga_id))
    assert "compensation" in table.stdout and "failed" in table.stdout
    listed = saga_cli(
        order_system.database_urls["orders"],
        "list",
        "--status",
        "compensated",
        "--json",
        "--limit",
        "5",
    )
    assert len(json.loads(listed.stdout)) == 5
