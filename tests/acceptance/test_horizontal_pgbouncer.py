"""Horizontal runs behind PgBouncer: the order saga example with two relays and two
consumer processes per service (as if on two hosts), every database URL through a
PgBouncer in transaction mode. Competing consumers of one queue must keep per-saga order
and exactly-once effects, and the pooler must cost nothing in correctness."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from saga.db.connections import POOLED_POLLING
from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import Cluster
from saga.examples.order_saga.gateway import GatewayClient
from tests.rig.checker import check
from tests.rig.pgbouncer_server import PgBouncerServer, pgbouncer_program
from tests.support import servers
from tests.support.chaos_runs import clean_chaos_run
from tests.support.example_cluster import services_as_processes

ORDERS = 300


def test_two_processes_per_service_through_pgbouncer_on_rabbitmq(
    order_system: Cluster, pgbouncer: PgBouncerServer, tmp_path: Path
) -> None:
    system = dataclasses.replace(
        order_system,
        database_urls={s: pgbouncer.url_for(u) for s, u in order_system.database_urls.items()},
        processes=2,
        access=POOLED_POLLING,
        extra_env={**order_system.extra_env, "ORDER_SAGA_FLAKINESS": "0.03"},
    )
    orders = workload.make_orders(ORDERS, workload.FailureRates(0.05, 0.05, 0.05, 0.05), seed=7)
    with services_as_processes(system, tmp_path) as processes:
        assert (
            sum(1 for p in processes if p.name.startswith("orders")) == 4
        )  # 2 relays, 2 consumers
        workload.submit(system, orders)
        counts = workload.wait_until_settled(system, ORDERS, timeout=400)
        gateway = GatewayClient(system.gateway_url).state()
    assert counts.get("completed", 0) + counts.get("compensated", 0) == ORDERS, counts
    report = check(system, gateway)
    assert report.ok, report.violations[:10]
    assert report.figures["sagas_out_of_order"] == 0
    assert report.figures["effects_duplicated"] == 0


def test_chaos_through_pgbouncer_with_two_processes_per_service(postgres_url: str) -> None:
    """The chaos run on the PostgreSQL broker (its private PostgreSQL crashed and started
    again behind the pooler; the shared servers are never restarted)."""
    servers.pgbouncer(pgbouncer_program())  # on CI, a missing PgBouncer fails here
    run = clean_chaos_run("--broker", "postgres", "--pgbouncer", "--processes", "2",
                          "--sagas", "80", "--duration", "30", "--interval", "1.5",
                          "--heartbeat", "2")  # fmt: skip
    assert "through PgBouncer, 2 process(es) per service" in run.output, run.output[-3000:]
    assert int(run.figures["sagas"]) >= 80
