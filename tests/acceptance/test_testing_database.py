"""saga.testing's pytest plugin and the databases it is pointed at, run as a user runs it.

A user's test file in an empty folder, run by ``python -m pytest`` in a subprocess
(the plugin comes from the installed package's ``pytest11`` entry point, no
conftest.py): the plugin must never empty a database it does not own, must make
and drop a database of its own on a server, and must create a missing one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.databases import DatabaseFactory, TestDatabase, with_database

USER_TESTS = """
from pydantic import BaseModel

from saga import Outbox, Service


class Note(BaseModel):
    text: str


notes = Service("notes")
SCHEMA = "CREATE TABLE IF NOT EXISTS notes (text text NOT NULL)"


@notes.handler(Note)
def note(tx, msg: Note, ctx) -> None:
    tx.execute("INSERT INTO notes VALUES (%s)", (msg.text,))


def test_a_note_is_written(saga_harness):
    h = saga_harness(services=[notes], schema=[SCHEMA])
    with h.transaction() as tx:
        Outbox().add(tx, Note(text="hello"), destination="notes")
    h.run_until_idle()
    assert h.rows("SELECT text FROM notes") == [("hello",)]
"""


def run_user_tests(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SAGA_", "PYTEST_")) and k != "PYTHONPATH"}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "test_notes.py").write_text(USER_TESTS)
    return folder


def databases(postgres_url: str) -> set[str]:
    with psycopg.connect(postgres_url) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}


def test_a_database_holding_a_foreign_table_is_refused_and_left_untouched(
    user_folder: Path, empty_db: TestDatabase
) -> None:
    empty_db.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
    empty_db.execute("INSERT INTO customers VALUES (1, 'Ann'), (2, 'Bob')")

    run = run_user_tests(user_folder, "--saga-database-url", empty_db.url)

    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "1 error" in run.stdout, run.stdout[-3000:]
    assert "ForeignDatabase" in run.stdout
    assert f"will not use database '{empty_db.name}'" in run.stdout
    assert "holds tables it did not create (public.customers)" in run.stdout
    assert "--saga-server-url" in run.stdout  # how to go on
    assert empty_db.rows("SELECT id, name FROM customers ORDER BY id") == [(1, "Ann"), (2, "Bob")]
    assert empty_db.scalar("SELECT to_regclass('saga.outbox')") is None  # nothing migrated


def test_a_server_gives_each_session_a_database_of_its_own_dropped_afterwards(
    user_folder: Path, postgres_url: str
) -> None:
    before = databases(postgres_url)
    run = run_user_tests(user_folder, "--saga-server-url", postgres_url)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "1 passed" in run.stdout
    left = {name for name in databases(postgres_url) - before if "template" not in name}
    assert not any(name.startswith("saga_test_") for name in left), left


def test_keep_database_keeps_it_and_names_it(user_folder: Path, postgres_url: str) -> None:
    run = run_user_tests(user_folder, "--saga-server-url", postgres_url, "--saga-keep-database")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    found = re.search(r"saga.testing kept its test database: \S+/(saga_test_[0-9a-f]+)", run.stdout)
    assert found, run.stdout[-3000:]
    kept = found.group(1)
    try:
        with psycopg.connect(with_database(postgres_url, kept)) as conn:
            assert conn.execute("SELECT text FROM notes").fetchall() == [("hello",)]
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {kept} WITH (FORCE)".encode())


@pytest.fixture
def missing_database(database_factory: DatabaseFactory, postgres_url: str) -> Iterator[str]:
    """The URL of a database that does not exist (dropped again after the test)."""
    name = f"saga_missing_{os.getpid()}"
    database_factory.drop(name)
    yield with_database(postgres_url, name)
    database_factory.drop(name)


def test_a_missing_database_is_created_marked_and_used_again(
    user_folder: Path, missing_database: str
) -> None:
    url = missing_database
    for _ in range(2):  # the second run finds it marked as the harness's own
        run = run_user_tests(user_folder, "--saga-database-url", url)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM saga_testing.marker").fetchone() == (1,)
