"""A short chaos run on a private three-node RabbitMQ cluster with quorum queues: while
orders flow, one node is SIGKILLed and started again, later another. The stuck-saga sweep
is off, and nothing is tolerated: every saga ends through its own messages (every command
and every participant's reply arrives), every event reaches both of its subscribers
(notifications and analytics, counted against the orders that published them), no effect
is applied twice. ``make chaos CHAOS_ARGS="--broker rabbitmq-cluster"`` runs a longer one,
``--runs 10`` ten in a row. The shared servers are never restarted."""

from __future__ import annotations

import ast
import re

from tests.rig.chaos import RABBITMQ_CLUSTER_KINDS
from tests.rig.rabbitmq_cluster import RABBITMQ_BIN, rabbitmq_installed
from tests.support import servers
from tests.support.chaos_runs import clean_chaos_run


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
    assert figures["resumed_automatically"] == "0", run.last_line  # the sweep is off
    checked = dict(re.findall(r"^  (\w+): (\S+)$", output, re.MULTILINE))  # the checker's
    for figure in ("commands_lost", "notices_missing", "notices_duplicated", "outbox_ready"):
        assert checked[figure] == "0", (figure, checked)
    assert int(checked["notices"]) > 0, checked  # the events did flow
