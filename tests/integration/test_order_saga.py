"""The order saga example across four databases, services in threads."""

from __future__ import annotations

from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import Cluster
from saga.examples.order_saga.gateway import GatewayClient
from tests.rig.checker import check
from tests.support.brokers import TestBroker
from tests.support.example_cluster import services_in_threads


def test_orders_complete_or_compensate_and_the_checker_passes(
    order_system: Cluster, rabbit: TestBroker
) -> None:
    orders = workload.make_orders(60, workload.FailureRates(0.1, 0.1, 0.1, 0.1))
    with services_in_threads(order_system, rabbit):
        workload.submit(order_system, orders)
        counts = workload.wait_until_settled(order_system, len(orders), timeout=120)
        gateway = GatewayClient(order_system.gateway_url).state()
    assert counts.get("running", 0) == counts.get("compensating", 0) == 0, counts
    assert counts["completed"] > 0 and counts["compensated"] > 0
    # the full checker: lost, duplicated, unexpected, out of order, undrained, money and stock
    report = check(order_system, gateway)
    assert report.ok, report.violations
