"""Finding a saga by what the business knows (`saga list --key`, `--data`), through indexes,
and tables that stay readable at any width."""

from __future__ import annotations

import json
import re

import pytest

from saga.db.sql import render
from saga.engine.state import SagaStatus
from saga.engine.store import LIST_SAGAS, SagaFilter, list_parameters
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase

MANY = 20_000


@pytest.fixture
def many_sagas(db: TestDatabase) -> TestDatabase:
    """``MANY`` finished sagas with keys ``req-N`` and data ``{"order_id": "o-N", "amount": N}``."""
    db.execute(
        "INSERT INTO saga.saga_instances "
        "(id, name, saga_version, service, status, data, idempotency_key) "
        "SELECT gen_random_uuid(), 'create_order', 1, 'orders', 'completed', "
        "jsonb_build_object('order_id', 'o-' || i, 'amount', i), 'req-' || i "
        "FROM generate_series(1, %s) AS i",
        (MANY,),
    )
    db.execute("ANALYZE saga.saga_instances")
    return db


def listed(db: TestDatabase, *filters: str) -> list[str]:
    result = saga_cli(db.url, "list", *filters, "--json")
    assert result.returncode == 0, result.stderr
    return [saga["id"] for saga in json.loads(result.stdout)]


def saga_id(db: TestDatabase, where: str) -> str:
    return str(db.scalar(f"SELECT id FROM saga.saga_instances WHERE {where}"))


def test_list_finds_a_saga_by_its_key_or_by_fields_of_its_data(many_sagas: TestDatabase) -> None:
    db = many_sagas
    seventeen = saga_id(db, "idempotency_key = 'req-17'")
    assert listed(db, "--key", "req-17") == [seventeen]
    assert listed(db, "--data", "order_id=o-17") == [seventeen]
    assert listed(db, "--data", "amount:=17", "--data", "order_id=o-17") == [seventeen]
    assert listed(db, "--data", "amount:=17", "--data", "order_id=o-18") == []
    assert listed(db, "--data", "amount=17") == []  # text "17" is not the number 17
    assert listed(db, "--key", "req-17", "--status", "running") == []


@pytest.mark.parametrize(
    ("value", "complaint"),
    [("order_id", "is not field=value"), ("amount:=seventeen", "is not JSON")],
)
def test_a_malformed_data_filter_is_refused(db: TestDatabase, value: str, complaint: str) -> None:
    result = saga_cli(db.url, "list", "--data", value)
    assert result.returncode == 2
    assert complaint in result.stderr


def test_key_and_data_filters_read_through_their_indexes(many_sagas: TestDatabase) -> None:
    with many_sagas.connect() as conn:

        def plan(where: SagaFilter) -> str:
            query = "EXPLAIN " + render(LIST_SAGAS, "saga")
            return "\n".join(row[0] for row in conn.execute(query, list_parameters(where)))

        assert "saga_instances_idempotency_key" in plan(SagaFilter(key="req-17"))
        assert "saga_instances_data" in plan(SagaFilter(data={"order_id": "o-17"}))


def plain(output: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", output)  # without styles


def header_of_each_column(output: str) -> list[str]:
    """The headers of the first table in ``output``, each column's folded lines joined."""
    lines = plain(output).splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    bottom = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    rows = [line.strip("┃").split("┃") for line in lines[top + 1 : bottom]]
    return [
        " ".join(" ".join(cell.strip() for cell in column).split())
        for column in zip(*rows, strict=True)
    ]


@pytest.mark.parametrize("terminal", [True, False], ids=["80-column terminal", "piped"])
def test_stats_headers_stay_whole_at_80_columns(many_sagas: TestDatabase, terminal: bool) -> None:
    tty = {"TTY_COMPATIBLE": "1"} if terminal else {}
    result = saga_cli(many_sagas.url, "stats", COLUMNS="80", **tty)
    assert result.returncode == 0, result.stderr
    headers = header_of_each_column(result.stdout)
    assert [h.replace(" ", "") for h in headers[1:-2]] == [s.value for s in SagaStatus]
    assert "…" not in result.stdout
    if terminal:
        assert max(len(line) for line in plain(result.stdout).splitlines()) <= 80
    else:  # not a terminal: nothing folded, every header on one line
        assert headers[1:-2] == [s.value for s in SagaStatus]


def test_list_piped_prints_every_cell_whole(db: TestDatabase) -> None:
    error = "charge: " + "the gateway refused the card for a reason that takes many words " * 3
    db.execute(
        "INSERT INTO saga.saga_instances (id, name, saga_version, service, status, data, "
        "last_error) VALUES (gen_random_uuid(), 'create_order', 1, 'orders', 'compensated', "
        "'{}', %s)",
        (error.strip(),),
    )
    result = saga_cli(db.url, "list", COLUMNS="80")
    assert error.strip() in result.stdout
