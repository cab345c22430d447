"""Running ``saga`` commands as real subprocesses (the demo, tests and chaos runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAGA = str(Path(sys.executable).parent / "saga")
#: Where the processes start: the checkout (so ``tests.*`` targets import), or, when
#: the example runs from an installed wheel, the caller's own folder.
PROCESS_DIR = REPO if (REPO / "pyproject.toml").is_file() else None


class SagaProcess:
    """One ``saga ...`` subprocess with its output captured to a file.

    ``args`` are the ``saga`` command's arguments, or a whole command line when
    its first element is an absolute path (another program).
    """

    def __init__(self, args: list[str], env: dict[str, str], log_dir: Path, name: str) -> None:
        self.args = args
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("ab")
        self._log_start = self._log.tell()  # the log may hold earlier runs' output
        command = args if args and os.path.isabs(args[0]) else [SAGA, *args]
        self.proc = subprocess.Popen(
            command,
            cwd=PROCESS_DIR,
            env={**_clean_environ(), **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def terminate(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait(10)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is not None:
                self._log.close()

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def wait_for_output(self, text: str, timeout: float) -> None:
        """Block until the process has written ``text``; raise if it exits or time runs out."""
        deadline = time.monotonic() + timeout
        while text not in self.output(since_start=True):
            if self.returncode is not None:
                raise RuntimeError(f"{self.name} exited ({self.returncode}) before saying {text!r}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not say {text!r} within {timeout:.0f}s")
            time.sleep(0.05)

    def output(self, since_start: bool = False) -> str:
        """The log's text; with ``since_start``, only what this process wrote."""
        if not self._log.closed:
            self._log.flush()
        written = self.log_path.read_bytes()
        return written[self._log_start if since_start else 0 :].decode(errors="replace")


def saga_env(database_url: str, broker_url: str, queue_prefix: str, **extra: str) -> dict[str, str]:
    env = {
        "SAGA_DATABASE_URL": database_url,
        "SAGA_BROKER_URL": broker_url,
        "SAGA_QUEUE_PREFIX": queue_prefix,
        "PYTHONUNBUFFERED": "1",
    }
    env.update(extra)
    return env


def _clean_environ() -> dict[str, str]:
    """This process's environment without any SAGA_* setting (tests pass their own)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
