"""The test database: the framework's tables and the user's, emptied before each test.

Emptying is one ``DELETE`` per table, children before parents, in one
transaction: a few milliseconds for a test's handful of rows, where
``TRUNCATE`` (a file per table) or a fresh database from a template costs
hundreds. Point it at a database used only by tests: every row in it goes.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from saga.db.schema import migrate
from saga.db.sql import validate_schema
from saga.observability.redaction import redact_url

logger = logging.getLogger(__name__)

#: Where the harness finds the test database when no URL is given in code.
DATABASE_URL_VARIABLE = "SAGA_TEST_DATABASE_URL"
#: The database the harness creates on the embedded server.
EMBEDDED_DATABASE = "saga_testing"

_TABLES = """
SELECT c.oid, format('%%I.%%I', n.nspname, c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%'
  AND NOT (n.nspname = %s AND c.relname = 'schema_migrations')
"""
_REFERENCES = "SELECT conrelid, confrelid FROM pg_constraint WHERE contype = 'f'"


class HarnessDatabase:
    """A test database, migrated once per session; :meth:`reset` empties it."""

    def __init__(self, url: str, *, schema: str = "saga") -> None:
        self.url = url
        self.schema = validate_schema(schema)
        self._applied: set[str] = set()
        self._emptying: sql.Composed | None = None
        with psycopg.connect(url) as conn:
            migrate(conn, schema)

    def __repr__(self) -> str:
        return f"HarnessDatabase({redact_url(self.url)!r})"

    @classmethod
    def resolve(cls, url: str | None = None, *, schema: str = "saga") -> HarnessDatabase:
        """``url``, else ``$SAGA_TEST_DATABASE_URL``, else a database on the embedded server."""
        url = url or os.environ.get(DATABASE_URL_VARIABLE)
        if url:
            return cls(url, schema=schema)
        return cls(embedded_database_url(), schema=schema)

    def apply(self, schema_sql: Iterable[str | Path]) -> None:
        """Run each SQL file or text once per session (idempotent DDL: CREATE ... IF NOT EXISTS)."""
        texts = [s.read_text() if isinstance(s, Path) else s for s in schema_sql]
        new = [t for t in texts if _digest(t) not in self._applied]
        if not new:
            return
        with psycopg.connect(self.url) as conn:
            for text in new:
                conn.execute(text.encode())
        self._applied.update(_digest(t) for t in new)
        self._emptying = None  # new tables to empty

    def reset(self, conn: psycopg.Connection[Any]) -> None:
        """Delete every row of every table but the migrations' record, in one transaction."""
        if self._emptying is None:
            self._emptying = self._emptying_statement(conn)
        with conn.transaction():
            conn.execute(self._emptying)

    def _emptying_statement(self, conn: psycopg.Connection[Any]) -> sql.Composed:
        tables = dict(conn.execute(_TABLES, (self.schema,)).fetchall())
        references = conn.execute(_REFERENCES).fetchall()
        order = _children_first(list(tables), references)
        return sql.SQL("; ").join(
            sql.SQL("DELETE FROM {}").format(sql.SQL(tables[oid])) for oid in order
        )


def embedded_database_url() -> str:
    """The ``saga_testing`` database on the embedded PostgreSQL (the ``demo`` extra)."""
    from saga.db.embedded import EmbeddedPostgres

    server = EmbeddedPostgres.shared()
    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (EMBEDDED_DATABASE,)
        ).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(EMBEDDED_DATABASE)))
    return server.url(EMBEDDED_DATABASE)


def _children_first(tables: list[int], references: list[tuple[int, int]]) -> list[int]:
    """``tables`` ordered so that a table comes before every table it references."""
    ordered: list[int] = []
    seen: set[int] = set()

    def visit(table: int) -> None:
        if table in seen:
            return
        seen.add(table)
        for child, parent in references:
            if parent == table and child != table and child in tables:
                visit(child)
        ordered.append(table)

    for table in tables:
        visit(table)
    return ordered


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
