"""A private PgBouncer in transaction mode in front of a PostgreSQL server.

It listens on a free port of 127.0.0.1 and passes every database name (the ``*``
alias) to the backend, so ``url_for("postgresql://postgres@127.0.0.1:5432/orders")``
is the same database reached through the pooler. ``pool_mode = transaction``: a
server connection serves another client after every transaction, which is what a
framework behind PgBouncer must survive (no prepared statements, no session state,
no LISTEN). Debian's PgBouncer 1.18 refuses to run as root: as root it runs as the
``postgres`` user, like :mod:`tests.rig.postgres_server`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.rig.redis_server import free_port

PGBOUNCER = "/usr/sbin/pgbouncer"


def pgbouncer_program() -> str | None:
    """The installed PgBouncer (Debian's package puts it outside ``PATH`` for users)."""
    return shutil.which("pgbouncer") or (PGBOUNCER if os.access(PGBOUNCER, os.X_OK) else None)


class PgBouncerServer:
    """One PgBouncer process in transaction mode; ``url_for`` routes a URL through it."""

    def __init__(
        self,
        backend_host: str = "127.0.0.1",
        backend_port: int = 5432,
        *,
        users: tuple[str, ...] = ("postgres",),
        pool_size: int = 20,
        program: str | None = None,
    ) -> None:
        program = program or pgbouncer_program()
        if program is None:
            raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
        self.program = program
        self.backend = (backend_host, backend_port)
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="saga-pgbouncer-"))
        self.config = self.folder / "pgbouncer.ini"
        self.log = self.folder / "pgbouncer.log"
        self._owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        self._write_config(users, pool_size)
        self._process: subprocess.Popen[bytes] | None = None

    def url_for(self, url: str) -> str:
        """``url`` (a database on the backend) reached through this PgBouncer instead."""
        parts = urlsplit(url)
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    def start(self, timeout: float = 30.0) -> None:
        owner = self._owner
        self._process = subprocess.Popen(
            [self.program, str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.folder,
            user=owner.pw_uid if owner else None,
            group=owner.pw_gid if owner else None,
            extra_groups=[] if owner else None,
        )
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self._process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited at start: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer on port {self.port} not up after {timeout}s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
        self._process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PgBouncerServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_config(self, users: tuple[str, ...], pool_size: int) -> None:
        host, port = self.backend
        userlist = self.folder / "userlist.txt"
        userlist.write_text("".join(f'"{user}" ""\n' for user in users))
        self.config.write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {userlist}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 2000\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.log}\n"
            f"pidfile = {self.folder / 'pgbouncer.pid'}\n"
        )
        if self._owner is not None:
            for path in (self.folder, self.config, userlist):
                os.chown(path, self._owner.pw_uid, self._owner.pw_gid)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), 1.0):
                return True
        except OSError:
            return False

    def _log_tail(self) -> str:
        try:
            return self.log.read_text()[-2000:]
        except OSError:
            return "(no log)"
