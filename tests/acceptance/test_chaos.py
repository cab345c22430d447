"""A short chaos run as part of the suite (``make chaos`` runs a longer one)."""

from __future__ import annotations

from tests.rig.chaos import KINDS
from tests.support import servers
from tests.support.chaos_runs import clean_chaos_run


def test_short_chaos_run_loses_nothing_and_applies_nothing_twice(
    postgres_url: str, amqp_url: str
) -> None:
    """The run restarts the local PostgreSQL and RabbitMQ with their own tools."""
    servers.require_program("rabbitmqctl", servers.RABBITMQCTL_HINT)
    servers.require_program("pg_ctlcluster", servers.PG_CTLCLUSTER_HINT)
    run = clean_chaos_run("--sagas", "120", "--duration", "30", "--interval", "1.5",
                          "--heartbeat", "2")  # fmt: skip
    figures, output = run.figures, run.output
    assert int(figures["sagas"]) >= 120
    for kind in KINDS:
        assert f"'{kind}'" in output, f"no {kind} fault in {output[-2000:]}"
