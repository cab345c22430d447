"""The test database: the framework's tables and the user's, emptied before each test.

It is a database of the harness's own: created for the test session on a server
(:meth:`HarnessDatabase.create`) and dropped after it, or one named for the
tests that the harness created or found empty (:meth:`HarnessDatabase`);
either way it carries the harness's marker (:mod:`saga.testing.ownership`), and
any other database is refused before a row is touched.

Emptying is one ``DELETE`` per table, children before parents, in one
transaction: a few milliseconds for a test's handful of rows, where
``TRUNCATE`` (a file per table) or a fresh database from a template costs
hundreds.
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
from saga.testing.ownership import claim
from saga.testing.server import (
    DATABASE_URL_VARIABLE,
    SERVER_URL_VARIABLE,
    create_missing_database,
    create_session_database,
    database_name,
    drop_database,
    embedded_server_url,
)
from saga.testing.user_schema import schema_texts

logger = logging.getLogger(__name__)

_TABLES = """
SELECT c.oid, format('%%I.%%I', n.nspname, c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%'
  AND NOT (n.nspname = %s AND c.relname = 'schema_migrations')
  AND NOT (n.nspname = 'saga_testing' AND c.relname = 'marker')
"""
_REFERENCES = "SELECT conrelid, confrelid FROM pg_constraint WHERE contype = 'f'"


class HarnessDatabase:
    """A test database of the harness's own, migrated; :meth:`reset` empties it.

    ``HarnessDatabase(url)`` uses the database ``url`` names, created if it does not
    exist, refused (:class:`~saga.errors.ForeignDatabase`) if it holds tables
    the harness did not create. :meth:`create` makes a fresh one on a server instead,
    which :meth:`close` drops.
    """

    def __init__(self, url: str, *, schema: str = "saga") -> None:
        self.url = url
        self.name = database_name(url)
        self.schema = validate_schema(schema)
        self.server_url: str | None = None  # set when the harness created it for the session
        self._applied: set[str] = set()
        self._emptying: sql.Composed | None = None
        if not self._exists():
            create_missing_database(url)
        with psycopg.connect(url) as conn:
            claim(conn, self.name)
            migrate(conn, schema)

    def __repr__(self) -> str:
        return f"HarnessDatabase({redact_url(self.url)!r})"

    @classmethod
    def create(cls, server_url: str | None = None, *, schema: str = "saga") -> HarnessDatabase:
        """A fresh database on ``server_url`` (None: the embedded server), dropped by
        :meth:`close`."""
        server = server_url or embedded_server_url()
        url = create_session_database(server, validate_schema(schema))
        try:
            database = cls(url, schema=schema)
        except BaseException:
            drop_database(server, database_name(url))
            raise
        database.server_url = server
        return database

    @classmethod
    def resolve(
        cls, url: str | None = None, *, server_url: str | None = None, schema: str = "saga"
    ) -> HarnessDatabase:
        """``url`` (else ``$SAGA_TEST_DATABASE_URL``) as is; else a fresh database on
        ``server_url`` (else ``$SAGA_TEST_SERVER_URL``, else the embedded server)."""
        url = url or os.environ.get(DATABASE_URL_VARIABLE)
        if url:
            return cls(url, schema=schema)
        return cls.create(server_url or os.environ.get(SERVER_URL_VARIABLE), schema=schema)

    def close(self) -> None:
        """Drop the database if the harness created it for the session; keep it otherwise."""
        if self.server_url is not None:
            drop_database(self.server_url, self.name)
            self.server_url = None

    def __enter__(self) -> HarnessDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def apply(self, schema_sql: Iterable[str | Path]) -> None:
        """Run each SQL file or text once per session (idempotent DDL: CREATE ... IF NOT EXISTS)."""
        texts = schema_texts(schema_sql)
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

    def _exists(self) -> bool:
        try:
            psycopg.connect(self.url).close()
        except psycopg.OperationalError:
            return False  # or unreachable: creating it says which
        return True

    def _emptying_statement(self, conn: psycopg.Connection[Any]) -> sql.Composed:
        tables = dict(conn.execute(_TABLES, (self.schema,)).fetchall())
        references = conn.execute(_REFERENCES).fetchall()
        order = _children_first(list(tables), references)
        return sql.SQL("; ").join(
            sql.SQL("DELETE FROM {}").format(sql.SQL(tables[oid])) for oid in order
        )


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
