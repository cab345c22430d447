"""A short chaos run on a private three-node RabbitMQ cluster with quorum queues: while
orders flow, one node is SIGKILLed and started again, later another; nothing is lost or
applied twice and every saga ends (``make chaos CHAOS_ARGS="--broker rabbitmq-cluster"``
runs a longer one). The shared servers are never restarted.

On RabbitMQ 3.10's quorum queues some runs leave a saga waiting on a command the broker
took and never delivered to a handler that committed (docs/scaling.md, "Cluster chaos");
the run's orders consumer resumes a saga with no progress for 45 s
(``SAGA_RESUME_STUCK_AFTER``), and the run lists each saga it resumed. More than
:data:`MOST_RESUMED` of the sagas in one run is not the broker's loss but a fault of ours."""

from __future__ import annotations

import ast

from saga.examples.order_saga.chaos import RABBITMQ_CLUSTER_KINDS
from saga.examples.order_saga.rabbitmq_cluster import RABBITMQ_BIN, rabbitmq_installed
from tests.support import servers
from tests.support.chaos_runs import clean_chaos_run

#: The share of its sagas a run may resume by itself: of 31 runs on 2026-12-02, 25 lost
#: nothing, three left 1 saga each waiting, one 2, one 3 and one 4 (of 64).
MOST_RESUMED = 0.1


def test_chaos_on_a_three_node_cluster_loses_nothing_when_nodes_are_killed(
    postgres_url: str,
) -> None:
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
    resumed = [line for line in output.splitlines() if line.startswith("resumed automatically")]
    assert int(figures["resumed_automatically"]) == len(resumed), resumed
    assert len(resumed) <= MOST_RESUMED * int(figures["sagas"]), resumed
    print("\n".join(resumed) or "no saga needed resuming")
