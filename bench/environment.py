"""Where the benchmark runs: servers, a scratch database, and a description of the machine."""

from __future__ import annotations

import os
import platform
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from saga.db.schema import migrate

ADMIN_URL = os.environ.get(
    "SAGA_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
AMQP_URL = os.environ.get("SAGA_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@dataclass
class ScratchDatabase:
    """A migrated database that exists for one benchmark step."""

    name: str
    url: str

    @classmethod
    def create(
        cls, prefix: str = "saga_bench", *, framework: bool = True, log_statements: bool = False
    ) -> ScratchDatabase:
        """A new database; ``framework=False`` leaves it empty (no ``saga`` schema).

        ``log_statements`` makes the server log every statement of every later session on this
        database (``log_statement = 'all'`` for it alone; see ``bench.saga_sql_ceiling``).
        """
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            if log_statements:
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET log_statement = 'all'").format(
                        sql.Identifier(name)
                    )
                )
        url = _with_database(ADMIN_URL, name)
        if framework:
            with psycopg.connect(url) as conn:
                migrate(conn, "saga")
        return cls(name, url)

    def reset_settings(self) -> None:
        """Forget the settings ``create`` gave this database (new sessions log nothing)."""
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} RESET ALL").format(sql.Identifier(self.name)))

    def drop(self) -> None:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
            )


def machine() -> dict[str, Any]:
    """The facts a reader needs to compare figures: cores, memory, server settings."""
    settings: dict[str, Any] = {}
    with psycopg.connect(ADMIN_URL) as conn:
        for name in (
            "server_version",
            "synchronous_commit",
            "fsync",
            "wal_level",
            "shared_buffers",
            "max_connections",
        ):
            row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
            settings[name] = row[0] if row else None
    mem_kb = 0
    try:
        with open("/proc/meminfo") as f:
            mem_kb = int(f.readline().split()[1])
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "postgresql": settings,
    }
