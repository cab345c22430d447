"""Which databases the harness may empty: those that carry its marker.

The harness deletes every row of its database before each test, so it works
only on a database of its own. It marks one (a one-row table
``saga_testing.marker``) when it creates it or finds it empty, and refuses any
other, listing what it found there and changing nothing.
"""

from __future__ import annotations

from typing import Any

import psycopg

from saga.errors import ForeignDatabase

#: The schema and table whose presence says "this database belongs to saga.testing".
MARKER_SCHEMA = "saga_testing"
MARKER_TABLE = "marker"
MARKER_NOTE = "saga.testing owns this database: it deletes every row in it before each test"

_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('saga.testing.claim', 0))"
_MARKED = "SELECT to_regclass('saga_testing.marker') IS NOT NULL"
_RELATIONS = """
SELECT format('%I.%I', n.nspname, c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
ORDER BY 1
"""
_MARK = (
    "CREATE SCHEMA IF NOT EXISTS saga_testing",
    "CREATE TABLE IF NOT EXISTS saga_testing.marker (note text NOT NULL)",
)
_NOTE = "INSERT INTO saga_testing.marker (note) VALUES (%s)"
_SHOWN = 5


def claim(conn: psycopg.Connection[Any], database: str) -> None:
    """Make sure ``database`` (the one ``conn`` is on) is the harness's: marked already, or
    empty and marked now. Otherwise raise :class:`ForeignDatabase` and change nothing."""
    with conn.transaction():
        conn.execute(_LOCK)
        marked = conn.execute(_MARKED).fetchone()
        if marked is not None and marked[0]:
            return
        found = [row[0] for row in conn.execute(_RELATIONS).fetchall()]
        if found:
            raise ForeignDatabase(refusal(database, found))
        for statement in _MARK:
            conn.execute(statement.encode())
        conn.execute(_NOTE, (MARKER_NOTE,))


def refusal(database: str, found: list[str]) -> str:
    shown = ", ".join(found[:_SHOWN])
    if len(found) > _SHOWN:
        shown += f" and {len(found) - _SHOWN} more"
    return (
        f"saga.testing will not use database {database!r}: the harness deletes every row of "
        f"its database before each test, and this one holds tables it did not create "
        f"({shown}). Nothing was changed. To go on, either\n"
        "  - give the harness a server instead (--saga-server-url or SAGA_TEST_SERVER_URL, "
        "e.g. postgresql://user@host/postgres): it creates a database of its own for each "
        "test session and drops it afterwards;\n"
        "  - or name a database that does not exist yet (--saga-database-url or "
        "SAGA_TEST_DATABASE_URL): the harness creates it and keeps it for the next runs;\n"
        f"  - or, if {database!r} serves these tests alone and every row in it may go, mark "
        f"it as the harness's: CREATE SCHEMA {MARKER_SCHEMA}; "
        f"CREATE TABLE {MARKER_SCHEMA}.{MARKER_TABLE} (note text NOT NULL);"
    )
