"""A private three-node RabbitMQ cluster on this machine, for tests and chaos runs.

Three nodes of the installed RabbitMQ, each with its own node name
(``saga-<run>-c1@localhost`` ...), AMQP port, distribution port and folders (data,
logs, configuration) under one temporary folder, and an Erlang cookie of their own
(``HOME`` points the nodes and ``rabbitmqctl`` at it). No plugin is enabled, so no
management or Prometheus port is opened. The shared configuration in /etc/rabbitmq is
never read (``RABBITMQ_CONF_ENV_FILE`` and ``RABBITMQ_CONFIG_FILE`` are private), and
``rabbitmqctl`` is only ever pointed at these nodes (``-n``): the machine's own node
(``rabbit@localhost``) is never joined, reset or stopped.

The second and third nodes join the first (``stop_app``, ``reset``, ``join_cluster``,
``start_app``). :meth:`RabbitCluster.kill` SIGKILLs one node (its Erlang VM and what it
started); :meth:`RabbitCluster.start_node` brings it back, and it rejoins the cluster
from its own data folder.

Run it alone to get a cluster for a while::

    python -m tests.rig.rabbitmq_cluster --seconds 600
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

RABBITMQ_BIN = Path(os.environ.get("SAGA_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))
#: rabbitmqctl's own distribution ports are the node's plus 10000 (and a few more).
_DIST_PORTS = range(20000, 30000)


def rabbitmq_installed() -> bool:
    return (RABBITMQ_BIN / "rabbitmq-server").is_file() and (RABBITMQ_BIN / "rabbitmqctl").is_file()


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port_in(ports: range, taken: set[int]) -> int:
    for _ in range(200):
        port = secrets.choice(ports)
        if port not in taken and _free(port) and _free(port + 10000):
            taken.add(port)
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop}")


def _free_port(taken: set[int]) -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    taken.add(port)
    return port


@dataclass
class RabbitNode:
    """One node of the cluster: its name, ports, folder and (while it runs) process."""

    name: str
    port: int
    dist_port: int
    folder: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class RabbitCluster:
    """Three private RabbitMQ nodes clustered together; ``url`` lists them for kombu."""

    def __init__(self, size: int = 3) -> None:
        if not rabbitmq_installed():
            raise RuntimeError(f"RabbitMQ is not installed under {RABBITMQ_BIN}")
        run = uuid.uuid4().hex[:6]
        self.folder = Path(tempfile.mkdtemp(prefix=f"saga-rabbit-{run}-"))
        self.home = self.folder / "home"
        self.home.mkdir()
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(20).upper())
        cookie.chmod(0o400)
        (self.folder / "enabled_plugins").write_text("[].\n")
        (self.folder / "rabbitmq-env.conf").write_text("")
        taken: set[int] = set()
        self.nodes = [
            RabbitNode(
                name=f"saga-{run}-c{i + 1}@localhost",
                port=_free_port(taken),
                dist_port=_free_port_in(_DIST_PORTS, taken),
                folder=self.folder / f"c{i + 1}",
            )
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        """Every node's AMQP URL, separated by ``;`` (kombu's failover list)."""
        return ";".join(node.url for node in self.nodes)

    def start(self, timeout: float = 180.0) -> None:
        """Start every node and join the others to the first."""
        try:
            for node in self.nodes:
                self.start_node(node, timeout)
            first = self.nodes[0]
            for node in self.nodes[1:]:
                self.ctl(node, "stop_app")
                self.ctl(node, "reset")
                self.ctl(node, "join_cluster", first.name)
                self.ctl(node, "start_app")
            self.ctl(first, "await_online_nodes", str(len(self.nodes)), timeout=timeout)
        except BaseException:
            self.close()
            raise

    def start_node(self, node: RabbitNode, timeout: float = 180.0) -> None:
        """Start (or start again) one node and wait until it runs its application."""
        for sub in ("mnesia", "log"):
            (node.folder / sub).mkdir(parents=True, exist_ok=True)
        config = node.folder / "rabbitmq.conf"
        config.write_text(
            f"listeners.tcp.1 = 127.0.0.1:{node.port}\n"
            "loopback_users = none\n"
            "cluster_partition_handling = pause_minority\n"
        )
        log = (node.folder / "log" / "console.log").open("ab")
        node.process = subprocess.Popen(
            [str(RABBITMQ_BIN / "rabbitmq-server")],
            env=self._env(node),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=node.folder,
            start_new_session=True,  # its own process group: kill() takes all of it
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if not node.running:
                raise RuntimeError(f"{node.name} exited at start; see {node.folder / 'log'}")
            done = self._ctl_run(node, ["await_startup", "--timeout", "10"], 40)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node.name} not up after {timeout:.0f}s: {done.stderr!r}")
            time.sleep(0.5)

    def kill(self, node: RabbitNode) -> None:
        """SIGKILL the node: its VM and everything in its process group, no goodbye."""
        if node.process is not None and node.process.poll() is None:
            os.killpg(node.process.pid, signal.SIGKILL)
            node.process.wait(30)
        node.process = None

    def stop_node(self, node: RabbitNode) -> None:
        """Stop the node gracefully (SIGKILL if it will not)."""
        if not node.running:
            return
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self.ctl(node, "stop", timeout=60)
        if node.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(30)
        self.kill(node)

    def ctl(self, node: RabbitNode, *args: str, timeout: float = 120.0) -> str:
        """``rabbitmqctl -n <node> ...`` on one of this cluster's nodes; its output."""
        done = self._ctl_run(node, list(args), timeout)
        if done.returncode != 0:
            raise subprocess.CalledProcessError(
                done.returncode, ["rabbitmqctl", "-n", node.name, *args], done.stdout, done.stderr
            )
        return done.stdout

    def running_nodes(self) -> list[RabbitNode]:
        return [node for node in self.nodes if node.running]

    def close(self) -> None:
        for node in self.nodes:
            self.stop_node(node)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> RabbitCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ctl_run(
        self, node: RabbitNode, args: list[str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node.name, *args],
                env=self._env(node),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                cwd=self.folder,
            )
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(exc.cmd, 124, "", f"timed out after {timeout}s")

    def _env(self, node: RabbitNode) -> dict[str, str]:
        keep = ("PATH", "LANG", "LC_ALL", "TMPDIR")
        return {
            **{k: v for k, v in os.environ.items() if k in keep},
            "HOME": str(self.home),  # the cookie of this cluster
            "RABBITMQ_CONF_ENV_FILE": str(self.folder / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(node.folder / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(node.folder / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "RABBITMQ_NODENAME": node.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(node.port),
            "RABBITMQ_DIST_PORT": str(node.dist_port),
            "RABBITMQ_MNESIA_BASE": str(node.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(node.folder / "log"),
            "RABBITMQ_PID_FILE": str(node.folder / "rabbitmq.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="how long it runs")
    args = parser.parse_args(argv)
    with RabbitCluster() as cluster:
        print(f"SAGA_BROKER_URL='{cluster.url}'", flush=True)
        print(f"nodes: {', '.join(node.name for node in cluster.nodes)}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
