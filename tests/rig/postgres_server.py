"""A private PostgreSQL that a chaos run or a test may crash and start again.

Never the shared server: this one is a cluster of its own (``initdb`` in a
temporary folder), listening on a free port of 127.0.0.1. ``restart()`` stops
it with ``-m immediate`` (no checkpoint, no goodbye to the clients: what a
crash or a SIGKILL of the postmaster leaves) and starts it again, so it comes
back through crash recovery. PostgreSQL refuses to run as root: as root, the
cluster belongs to the ``postgres`` user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.rig.redis_server import free_port

POSTGRES_ROOT = Path("/usr/lib/postgresql")


def _bin_dir() -> Path:
    found = POSTGRES_ROOT.iterdir() if POSTGRES_ROOT.is_dir() else iter(())
    versions = sorted(found, key=lambda p: int(p.name))
    if not versions:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
    return versions[-1] / "bin"


class PostgresServer:
    """One private PostgreSQL cluster; ``url`` reaches its ``postgres`` database."""

    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="saga-pg-"))
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else None

    def start(self) -> None:
        if not self.data.exists():
            if self._owner is not None:
                os.chown(self.folder, self._owner.pw_uid, self._owner.pw_gid)
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N")
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
            "-c max_connections=300 -c fsync=off -c full_page_writes=off"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", "120", "start")  # fmt: skip

    def restart(self) -> None:
        """Crash the server (immediate shutdown) and start it again."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.start()

    def close(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except subprocess.CalledProcessError:
            pass  # not running
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        owner = self._owner
        subprocess.run(
            [str(self.bin / program), *args],
            check=True,
            capture_output=True,
            timeout=180,
            cwd=self.folder,
            user=owner.pw_uid if owner else None,
            group=owner.pw_gid if owner else None,
            extra_groups=[] if owner else None,
        )
