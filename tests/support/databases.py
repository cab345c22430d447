"""Fresh PostgreSQL databases for tests, copied from saga.testing's migrated template."""

from __future__ import annotations

import getpass
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg

from saga.testing.server import (
    create_missing_database,
    create_session_database,
    database_name,
    drop_database,
)


def with_credentials(url: str, user: str | None = None, password: str | None = None) -> str:
    """``url`` with its user and/or password replaced, whatever its shape (host, port, IPv6)."""
    parts = urlsplit(url)
    user = user or parts.username or getpass.getuser()
    password = password if password is not None else parts.password
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
    netloc = quote(user, safe="")
    if password is not None:
        netloc += ":" + quote(password, safe="")
    netloc += f"@{host or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@dataclass
class TestDatabase:
    """One throw-away database with the framework's tables in schema ``saga``."""

    __test__ = False

    url: str
    name: str
    schema: str = "saga"

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, **{"autocommit": True, **kwargs})

    def scalar(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        with self.connect() as conn:
            row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
            return row[0] if row else None

    def rows(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            return conn.execute(query, params).fetchall()  # type: ignore[arg-type]

    def execute(self, query: str, params: tuple[Any, ...] = ()) -> None:
        with self.connect() as conn:
            conn.execute(query, params)  # type: ignore[arg-type]

    def waiting_on_locks(self) -> int:
        """How many sessions on this database wait for a lock (row, table or advisory)."""
        return int(
            self.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
        )


class DatabaseFactory:
    """Creates databases on the test server the way :mod:`saga.testing.server` does for the
    harness: each a copy of the template it migrates once per set of migrations and keeps."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self._created: list[str] = []

    def create(self) -> TestDatabase:
        url = create_session_database(self.admin_url, "saga")
        return self._track(url)

    def create_empty(self) -> TestDatabase:
        url = with_database(self.admin_url, f"saga_empty_{uuid.uuid4().hex[:12]}")
        create_missing_database(url)
        return self._track(url)

    def _track(self, url: str) -> TestDatabase:
        name = database_name(url)
        self._created.append(name)
        return TestDatabase(url, name)

    def drop(self, name: str) -> None:
        drop_database(self.admin_url, name)

    def close(self) -> None:
        for name in self._created:
            self.drop(name)


@contextmanager
def transaction(url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(url) as conn, conn.transaction():
        yield conn


def wake_hints(db: TestDatabase, write: Callable[[], object]) -> int:
    """How many wake-up hints ``write`` sent, counted up to a marker sent after it commits.

    Notifications arrive in commit order, so no timeout decides the count.
    """
    with db.connect() as listener:
        listener.execute("LISTEN saga_outbox")
        write()
        listener.execute("NOTIFY saga_outbox, 'marker'")
        for hints, note in enumerate(listener.notifies()):
            if note.payload == "marker":
                return hints
    raise AssertionError("unreachable")
