"""The faults of a chaos run: each kind applied once, and what was done counted."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import psycopg

from saga.examples.order_saga.cluster import SERVICES, Cluster
from saga.examples.order_saga.gateway import GatewayClient
from saga.examples.order_saga.orders import OrderData, create_order
from tests.rig.private_servers import PrivateServers
from tests.rig.supervisor import Supervisor

GATEWAY_OUTAGE_S = 5.0
BROKER_URL = os.environ.get("SAGA_CHAOS_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
#: The local servers the run restarts, and waits for on these ports.
RABBITMQ_PORT = urlsplit(BROKER_URL).port or 5672


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 1.0):
            return True
    except OSError:
        return False


def wait_port(port: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not port_open(port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing answers on port {port} after {seconds}s")
        time.sleep(0.2)


class FaultInjector:
    """Applies one fault of a given kind and remembers what it did."""

    def __init__(
        self,
        supervisor: Supervisor,
        system: Cluster,
        heartbeat: int,
        rng: random.Random,
        servers: PrivateServers,
    ):
        self.servers = servers
        self.supervisor = supervisor
        self.system = system
        self.heartbeat = heartbeat
        self.rng = rng
        self.done: Counter[str] = Counter()
        self._nodes_killed = 0
        self._node_restart: threading.Thread | None = None
        self.late_orders: list[str] = []
        self._threads: list[threading.Thread] = []

    def inject(self, kind: str) -> None:
        getattr(self, kind)()
        self.done[kind] += 1

    def kill(self) -> None:
        ours = sorted(name for name in self.supervisor.processes if name != "gateway")
        self.supervisor.kill(self.rng.choice(ours))

    def pause(self) -> None:
        name = self.rng.choice([s for s in SERVICES if s in self.supervisor.processes])
        self.supervisor.pause(name)
        self._later(self.heartbeat * 2.5 + 1, lambda: self.supervisor.resume(name))

    def restart_rabbitmq(self) -> None:
        subprocess.run(["rabbitmqctl", "stop_app"], check=True, capture_output=True, timeout=120)
        subprocess.run(["rabbitmqctl", "start_app"], check=True, capture_output=True, timeout=120)
        wait_port(RABBITMQ_PORT, 60)

    def ready(self, kind: str) -> bool:
        """False for a node kill while the node killed last is still starting: one node
        down at a time (the other faults go on meanwhile)."""
        restarting = self._node_restart is not None and self._node_restart.is_alive()
        return not (kind == "kill_rabbitmq_node" and restarting)

    def kill_rabbitmq_node(self) -> None:
        """SIGKILL the next node of the private cluster and start it again in the background
        (it rejoins from its data folder) while the other two keep the quorum queues going
        and the other faults go on."""
        cluster = self.servers.rabbitmq
        assert cluster is not None, "kill_rabbitmq_node needs a run on a private cluster"
        node = cluster.nodes[self._nodes_killed % len(cluster.nodes)]
        self._nodes_killed += 1
        cluster.kill(node)
        self._node_restart = threading.Thread(target=cluster.start_node, args=(node,))
        self._node_restart.start()
        self._threads.append(self._node_restart)

    def restart_redis(self) -> None:
        """Crash the run's private Redis (SIGKILL) and start it again."""
        assert self.servers.redis is not None, "restart_redis needs a Redis run"
        self.servers.redis.restart()

    def restart_private_postgres(self) -> None:
        """Crash the run's private PostgreSQL (immediate shutdown) and start it again."""
        assert self.servers.postgres is not None, "needs a run on a private PostgreSQL"
        self.servers.postgres.restart()

    def restart_postgres(self) -> None:
        version = sorted(os.listdir("/etc/postgresql"))[0]
        subprocess.run(
            [
                "pg_ctlcluster",
                "--skip-systemctl-redirect",
                version,
                "main",
                "restart",
                "-m",
                "fast",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        wait_port(self.servers.postgres_port, 60)

    def idle_transaction(self) -> None:
        """A transaction that starts a saga, sits idle, and commits late."""
        order = OrderData(
            order_id=f"late-{uuid.uuid4().hex[:8]}", customer_id="c-00", sku="sku-00", quantity=1,
            amount_cents=100, card_token="tok_late", region="north",
        )  # fmt: skip

        def hold() -> None:
            try:
                with self.system.connect("orders") as conn, conn.transaction():
                    create_order.start(conn, order, idempotency_key=order.order_id)
                    time.sleep(self.heartbeat * 2)
                self.late_orders.append(order.order_id)
            except psycopg.Error:
                pass  # a PostgreSQL restart ended it: rolled back, nothing to check

        thread = threading.Thread(target=hold, daemon=True)
        thread.start()
        self._threads.append(thread)

    def gateway_outage(self) -> None:
        """Charges fail for longer than payments retries; the first one is made, its answer
        lost. The held sagas wait for the operator's replay (see :func:`replay_held`)."""
        gateway = GatewayClient(self.system.gateway_url)
        gateway.set_faults(charges_down=True, drop_charges=1)
        self._later(GATEWAY_OUTAGE_S, lambda: gateway.set_faults(charges_down=False))

    def _later(self, seconds: float, action: Any) -> None:
        timer = threading.Timer(seconds, action)
        timer.start()
        self._threads.append(timer)

    def settle(self) -> None:
        for thread in self._threads:
            thread.join(120)
