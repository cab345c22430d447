"""Migrations: idempotent, safe when run concurrently, equal to the declared schema."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from saga.db.schema import _LOCK as MIGRATION_LOCK
from saga.db.schema import available_migrations, declared_schema_sql, migrate, status
from saga.errors import InvalidIdentifier
from saga.examples.order_saga.processes import SagaProcess
from tests.support.databases import TestDatabase
from tests.support.wait import wait_until


def test_migrate_is_idempotent_and_reports_status(empty_db: TestDatabase) -> None:
    with empty_db.connect(autocommit=False) as conn:
        assert all(not s.applied for s in status(conn, "billing"))
        first = migrate(conn, "billing")
        second = migrate(conn, "billing")
        states = status(conn, "billing")
    assert [m.version for m in first] == [m.version for m in available_migrations()]
    assert second == []
    assert all(s.applied and s.checksum_matches for s in states)


def test_concurrent_migrations_apply_once(empty_db: TestDatabase) -> None:
    errors: list[BaseException] = []
    applied: list[int] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        try:
            with empty_db.connect(autocommit=False) as conn:
                barrier.wait()
                applied.append(len(migrate(conn, "saga_concurrent")))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(applied) == [0, 0, 0, len(available_migrations())]


def test_concurrent_migrations_from_separate_processes_apply_once(
    empty_db: TestDatabase, tmp_path: Path
) -> None:
    """Four ``saga db migrate`` processes queue behind a lock the test holds, then go at once."""
    schema = "saga_processes"
    env = {"SAGA_DATABASE_URL": empty_db.url}
    with empty_db.connect(autocommit=False) as gate, gate.transaction():
        gate.execute(MIGRATION_LOCK, (f"saga.migrate.{schema}",))
        processes = [
            SagaProcess(["db", "migrate", "--schema", schema], env, tmp_path, f"migrate-{i}")
            for i in range(4)
        ]
        wait_until(lambda: empty_db.waiting_on_locks() == 4, what="four processes waiting")
    codes = [process.wait(60) for process in processes]
    outputs = [process.output() for process in processes]
    assert codes == [0, 0, 0, 0], outputs
    applied = f"({len(available_migrations())} applied)"
    assert sorted(applied in out for out in outputs) == [False, False, False, True], outputs
    assert sum("nothing to apply" in out for out in outputs) == 3
    with empty_db.connect(autocommit=False) as conn:
        assert all(s.applied and s.checksum_matches for s in status(conn, schema))


@pytest.mark.parametrize("name", ["Bad", "1abc", "drop table x;--", "a" * 64, ""])
def test_invalid_schema_name_is_refused(empty_db: TestDatabase, name: str) -> None:
    with empty_db.connect(autocommit=False) as conn, pytest.raises(InvalidIdentifier):
        migrate(conn, name)


def _catalog(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Everything that defines a schema's shape, with the schema name taken out."""
    q = {
        "columns": """
            SELECT table_name, column_name, data_type, is_nullable, column_default, is_identity,
                   generation_expression,
                   -- the column's place (a dropped column leaves a gap in ordinal_position)
                   row_number() OVER (PARTITION BY table_name ORDER BY ordinal_position)
            FROM information_schema.columns WHERE table_schema = %s ORDER BY 1, 8""",
        "indexes": """
            SELECT tablename, indexname, replace(indexdef, %s || '.', '')
            FROM pg_indexes WHERE schemaname = %s ORDER BY 1, 2""",
        "constraints": """
            SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
            FROM pg_constraint WHERE connamespace = %s::regnamespace ORDER BY 2""",
        "options": """
            SELECT relname, reloptions FROM pg_class
            WHERE relnamespace = %s::regnamespace AND relkind IN ('r', 'v', 'm') ORDER BY 1""",
        "views": """
            SELECT viewname, definition FROM pg_views WHERE schemaname = %s ORDER BY 1""",
        "functions": """
            SELECT proname, pg_get_function_identity_arguments(oid)
            FROM pg_proc WHERE pronamespace = %s::regnamespace ORDER BY 1, 2""",
    }
    result = {}
    for key, query in q.items():
        params: tuple[str, ...] = (schema, schema) if key == "indexes" else (schema,)
        rows = conn.execute(query, params).fetchall()  # type: ignore[arg-type]
        result[key] = [
            tuple(str(v).replace(f"{schema}.", "") if isinstance(v, str) else v for v in row)
            for row in rows
        ]
    return result


def test_migrations_produce_the_declared_schema(empty_db: TestDatabase) -> None:
    with empty_db.connect(autocommit=False) as conn:
        migrate(conn, "migrated")
        with conn.transaction():
            conn.execute("CREATE SCHEMA declared")
            conn.execute("SET LOCAL search_path TO declared, public")
            conn.execute(declared_schema_sql().encode())
        migrated = _catalog(conn, "migrated")
        declared = _catalog(conn, "declared")
    migrated["columns"] = [r for r in migrated["columns"] if r[0] != "schema_migrations"]
    migrated["constraints"] = [
        r for r in migrated["constraints"] if "schema_migrations" not in r[1]
    ]
    migrated["options"] = [r for r in migrated["options"] if r[0] != "schema_migrations"]
    migrated["indexes"] = [r for r in migrated["indexes"] if r[0] != "schema_migrations"]
    for key in declared:
        assert migrated[key] == declared[key], key
