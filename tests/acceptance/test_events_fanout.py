"""Issue 16's acceptance: three subscribers, every event exactly once, through faults.

``tests.rig.fanout`` runs two publishers, their relays, and three subscribing
services (each a ``saga consume`` and a ``saga relay`` on its own database) as real
subprocesses; it SIGKILLs them while events flow and crashes the broker halfway: a
private RabbitMQ node, or the private PostgreSQL cluster holding the PostgreSQL broker
and every database (the shared servers are never restarted). Every subscriber's
database must end with every event exactly once. The in-suite run is scaled down; the
full one (10,000 events) is ``python -m tests.rig.fanout --events 10000``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rig.fanout import run
from tests.rig.postgres_server import POSTGRES_ROOT
from tests.rig.rabbitmq_cluster import rabbitmq_installed
from tests.support import servers

EVENTS = 2000


@pytest.mark.parametrize(
    "broker", [pytest.param("rabbitmq", marks=pytest.mark.rabbitmq), "postgres"]
)  # a private RabbitMQ node or PostgreSQL server of its own (crashed by the run)
def test_three_subscribers_get_every_event_once_through_kills_and_a_broker_crash(
    broker: str, postgres_url: str, tmp_path: Path
) -> None:
    if broker == "rabbitmq" and not rabbitmq_installed():
        servers.unavailable("rabbitmq-server", servers.RABBITMQCTL_HINT)
    elif not POSTGRES_ROOT.is_dir():
        servers.unavailable("initdb", "install the PostgreSQL server (apt-get install postgresql)")
    logs = tmp_path / "logs"
    result = run(broker, EVENTS, duration=30, interval=2.0, log_dir=logs, database_url=postgres_url)
    assert result["published"] == EVENTS
    assert result["per_subscriber"] == {
        name: {"rows": EVENTS, "distinct": EVENTS} for name in ("audit", "billing", "reporting")
    }, result.get("logs")
    assert (result["lost"], result["duplicated"]) == (0, 0)
    assert (result["broker_restarts"], result["kills"]) == (1, 14)  # 15 slots of 2 s
    assert result["process_restarts"] >= result["kills"]
    fired = result["fault_points_fired"]  # copies sent twice: the inboxes absorbed them
    assert fired.get("relay.after_publish", 0) >= 1 and fired.get("consumer.after_commit", 0) >= 2
