"""The pytest fixtures of :mod:`saga.testing`, loaded through the ``pytest11`` entry point.

- ``saga_database_url`` (session): ``--saga-database-url``, else ``$SAGA_TEST_DATABASE_URL``,
  else None (the embedded PostgreSQL of the ``demo`` extra). Override it in a conftest.py
  to hand the harness a database of your own.
- ``saga_database`` (session): that database, migrated once.
- ``saga_harness``: makes harnesses, ``saga_harness(registry, services=[...], schema=[...])``;
  each starts on an emptied database and is closed after the test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from saga.testing.database import DATABASE_URL_VARIABLE, HarnessDatabase
from saga.testing.harness import SagaHarness


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--saga-database-url",
        default=None,
        help=f"PostgreSQL database for saga.testing, emptied before each test "
        f"(env: {DATABASE_URL_VARIABLE}; default: the embedded server)",
    )


@pytest.fixture(scope="session")
def saga_database_url(request: pytest.FixtureRequest) -> str | None:
    option: str | None = request.config.getoption("--saga-database-url")
    return option or os.environ.get(DATABASE_URL_VARIABLE) or None


@pytest.fixture(scope="session")
def saga_database(saga_database_url: str | None) -> HarnessDatabase:
    return HarnessDatabase.resolve(saga_database_url)


@pytest.fixture
def saga_harness(saga_database: HarnessDatabase) -> Iterator[Callable[..., SagaHarness]]:
    made: list[SagaHarness] = []

    def make(*args: Any, **kwargs: Any) -> SagaHarness:
        harness = SagaHarness(saga_database, *args, **kwargs)
        made.append(harness)
        return harness

    yield make
    for harness in reversed(made):  # the last one made gives the registry back its clock last
        harness.close()
