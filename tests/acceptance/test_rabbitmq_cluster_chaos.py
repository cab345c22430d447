"""A short chaos run on a private three-node RabbitMQ cluster with quorum queues: while
orders flow, one node is SIGKILLed and started again, later another; nothing is lost or
applied twice and every saga ends (``make chaos CHAOS_ARGS="--broker rabbitmq-cluster"``
runs a longer one). The shared servers are never restarted."""

from __future__ import annotations

import ast

import pytest

from saga.examples.order_saga.chaos import RABBITMQ_CLUSTER_KINDS
from saga.examples.order_saga.rabbitmq_cluster import RABBITMQ_BIN, rabbitmq_installed
from tests.support import servers
from tests.support.chaos_runs import clean_chaos_run


@pytest.mark.xfail(
    strict=False,
    reason="known, open in issue 19: some runs (3 of 9 on 2026-12-02) leave a saga waiting on a "
    "command that RabbitMQ took (tx.commit-ok, the outbox row deleted) and no handler committed, "
    "with nothing lost from the outboxes or duplicated; the run prints each stuck saga, "
    "the message it awaits and the messages left in every queue",
)
def test_chaos_on_a_three_node_cluster_loses_nothing_when_nodes_are_killed() -> None:
    if not rabbitmq_installed():
        servers.unavailable("rabbitmq-server", f"{servers.RABBITMQCTL_HINT} ({RABBITMQ_BIN})")
    run = clean_chaos_run(
        "--broker", "rabbitmq-cluster", "--sagas", "60", "--duration", "120", "--interval", "2.5",
        "--seed", "3", timeout=1200,
    )  # fmt: skip
    figures, output = run.figures, run.output
    assert int(figures["sagas"]) >= 60
    injected = next(line for line in output.splitlines() if line.startswith("faults injected"))
    by_kind = ast.literal_eval(injected.split(" ", 3)[3])
    assert set(by_kind) == set(RABBITMQ_CLUSTER_KINDS), injected
    assert by_kind["kill_rabbitmq_node"] >= 2, injected  # one node, later another
