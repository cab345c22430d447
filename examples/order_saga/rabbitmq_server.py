"""A private RabbitMQ node that a run may crash and start again.

Never the shared broker: this node has a name of its own (``RABBITMQ_NODENAME``), its own
AMQP and distribution ports on 127.0.0.1, its own Erlang port mapper (``ERL_EPMD_PORT``),
its data and logs in a temporary folder, no plugins (management off) and none of the
machine's RabbitMQ settings (``/etc/rabbitmq`` is not read). ``restart()`` kills the
node with SIGKILL (what a crash or a power cut leaves: no goodbye to the clients) and
starts it again on the same data, so durable queues and persistent messages come back
from disk.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from saga.examples.order_saga.redis_server import free_port

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")


class RabbitMQServer:
    """One private RabbitMQ node; ``url`` reaches it as guest."""

    def __init__(self) -> None:
        if not (RABBITMQ_BIN / "rabbitmq-server").exists():
            raise RuntimeError(f"no rabbitmq-server in {RABBITMQ_BIN}")
        self.folder = Path(tempfile.mkdtemp(prefix="saga-rabbitmq-"))
        self.port = free_port()
        self.node = f"saga-{uuid.uuid4().hex[:8]}@localhost"
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.log = self.folder / "server.out"
        self._epmd_port = free_port()
        self._dist_port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        (self.folder / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
        )
        (self.folder / "enabled_plugins").write_text("[].\n")
        (self.folder / "env.conf").write_text("")

    @property
    def env(self) -> dict[str, str]:
        """The environment of the node and of ``rabbitmqctl`` for it."""
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.folder),  # the Erlang cookie lives here
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self._dist_port),
            "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq.conf"),
            "RABBITMQ_CONF_ENV_FILE": str(self.folder / "env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_PID_FILE": str(self.folder / "node.pid"),
            "ERL_EPMD_PORT": str(self._epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def start(self, timeout: float = 120.0) -> None:
        with self.log.open("ab") as out:
            self._process = subprocess.Popen(
                [str(RABBITMQ_BIN / "rabbitmq-server")],
                env=self.env,
                cwd=self.folder,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited: {self.log.read_text()[-2000:]}")
            done = subprocess.run(
                [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.node, "await_startup"],
                env=self.env,
                capture_output=True,
                timeout=max(5.0, deadline - time.monotonic()),
                check=False,
            )
            if done.returncode == 0 and _answers(self.port):
                return
            time.sleep(0.5)
        raise RuntimeError(f"rabbitmq node {self.node} did not start within {timeout:.0f}s")

    def kill(self) -> None:
        """SIGKILL every process of the node (the Erlang VM and its helpers)."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)

    def restart(self) -> None:
        """Crash the node (SIGKILL) and start it again on the same data."""
        self.kill()
        self.start()

    def close(self) -> None:
        self.kill()
        self._stop_port_mapper()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _stop_port_mapper(self, timeout: float = 10.0) -> None:
        """Stop the node's own ``epmd`` (it refuses while the dead node is still listed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = subprocess.run(
                ["epmd", "-kill"], env=self.env, capture_output=True, timeout=30, check=False
            )
            if done.returncode == 0 or not _answers(self._epmd_port):
                return
            time.sleep(0.2)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
