"""Numbered SQL migrations, shipped inside the package and applied under a lock.

Files are named ``NNNN_description.sql``; each runs once, in order, with
``search_path`` set to the framework's schema. ``migrate`` holds a
transaction-level advisory lock, so any number of processes may run it at
once: the first applies what is missing, the others then find nothing to do.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from saga.db.sql import render, validate_schema
from saga.errors import MigrationError

logger = logging.getLogger(__name__)

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
_APPLIED = "SELECT version, name, checksum, applied_at FROM {schema}.schema_migrations"
_RECORD = "INSERT INTO {schema}.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)"
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered SQL file."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class MigrationState:
    """A migration and whether (and when) it is applied in one schema."""

    migration: Migration
    applied_at: datetime | None
    checksum_matches: bool = True

    @property
    def applied(self) -> bool:
        return self.applied_at is not None


def available_migrations() -> list[Migration]:
    """All migrations that ship with this version of the framework, in order."""
    found: list[Migration] = []
    for entry in resources.files("saga.migrations").iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration numbers in {versions}")
    return found


def declared_schema_sql() -> str:
    """The whole current schema in one readable file (``migrations/schema.sql``).

    It is never applied by :func:`migrate`; a test checks that applying every
    migration in order produces exactly this schema.
    """
    return (resources.files("saga.migrations") / "schema.sql").read_text(encoding="utf-8")


def status(conn: psycopg.Connection[Any], schema: str = "saga") -> list[MigrationState]:
    """Each shipped migration with its applied time (None when pending)."""
    validate_schema(schema)
    applied: dict[int, tuple[str, datetime]] = {}
    with conn.transaction():
        exists = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.schema_migrations",)
        ).fetchone()
        if exists and exists[0]:
            for version, _name, checksum, applied_at in conn.execute(render(_APPLIED, schema)):
                applied[version] = (checksum, applied_at)
    states = []
    for migration in available_migrations():
        if migration.version in applied:
            checksum, at = applied[migration.version]
            states.append(MigrationState(migration, at, checksum == migration.checksum))
        else:
            states.append(MigrationState(migration, None))
    return states


def migrate(conn: psycopg.Connection[Any], schema: str = "saga") -> list[Migration]:
    """Apply every pending migration to ``schema`` in one transaction; return those applied.

    ``conn`` must not be inside a transaction. Safe to run concurrently.
    """
    validate_schema(schema)
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise MigrationError("migrate() needs a connection that is not inside a transaction")
    applied_now: list[Migration] = []
    try:
        with conn.transaction():
            conn.execute(_LOCK, (f"saga.migrate.{schema}",))
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            conn.execute(render(_VERSION_TABLE, schema))
            done = {row[0] for row in conn.execute(render(_APPLIED, schema))}
            for migration in available_migrations():
                if migration.version in done:
                    continue
                logger.info("applying migration %04d_%s", migration.version, migration.name)
                conn.execute(
                    sql.SQL("SET LOCAL search_path TO {}, public").format(sql.Identifier(schema))
                )
                conn.execute(migration.sql.encode())
                conn.execute(
                    render(_RECORD, schema),
                    (migration.version, migration.name, migration.checksum),
                )
                applied_now.append(migration)
    except psycopg.Error as exc:
        raise MigrationError(f"migrating schema {schema!r} failed: {exc}") from exc
    return applied_now
