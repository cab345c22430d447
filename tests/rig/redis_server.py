"""A private ``redis-server`` that a chaos run or a test may crash and start again.

Never the shared Redis: this one runs on a free port with its own data
directory, persistent (``appendonly yes``, ``appendfsync always``) or not (no
append-only file, no snapshots: it forgets everything when it restarts).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process; ``restart()`` crashes it (SIGKILL) and starts it again."""

    def __init__(self, *, persistent: bool, extra_args: tuple[str, ...] = ()) -> None:
        executable = shutil.which("redis-server")
        if executable is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.executable = executable
        self.persistent = persistent
        self.extra_args = extra_args
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="saga-redis-"))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30.0) -> None:
        durability = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.persistent
            else ["--appendonly", "no"]
        )
        self._process = subprocess.Popen(
            [self.executable, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--dir", str(self.directory), *durability, *self.extra_args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited at start")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} not up after {timeout}s")
            time.sleep(0.05)

    def crash(self) -> None:
        """SIGKILL: whatever is not on disk is gone."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(30)
        self._process = None

    def restart(self) -> None:
        self.crash()
        self.start()

    def close(self) -> None:
        self.crash()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _answers(self) -> bool:
        """True once the server replies to PING (a listening socket alone may still be loading)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), 1.0) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(64).startswith(b"+PONG")
        except OSError:
            return False
