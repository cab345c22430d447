"""The pytest fixtures of :mod:`saga.testing`, loaded through the ``pytest11`` entry point.

- ``saga_server_url`` (session): ``--saga-server-url``, else ``$SAGA_TEST_SERVER_URL``, else
  None (the embedded PostgreSQL of the ``demo`` extra): the server on which each test
  session gets a database of its own, dropped at the end (``--saga-keep-database`` keeps it).
- ``saga_database_url`` (session): ``--saga-database-url``, else ``$SAGA_TEST_DATABASE_URL``,
  else None: one database used as is instead, created if missing, refused unless it is
  empty or the harness's own.
- ``saga_database`` (session): that database, migrated once. Override ``saga_server_url``
  or ``saga_database_url`` in a conftest.py to choose in code.
- ``saga_harness``: makes harnesses, ``saga_harness(registry, services=[...], schema=[...])``;
  each starts on an emptied database and is closed after the test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from saga.observability.redaction import redact_url
from saga.testing.database import HarnessDatabase
from saga.testing.harness import SagaHarness
from saga.testing.server import DATABASE_URL_VARIABLE, SERVER_URL_VARIABLE

_KEPT = pytest.StashKey[list[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("saga", "saga.testing")
    group.addoption(
        "--saga-server-url",
        default=None,
        help=f"PostgreSQL server on which each test session gets a database of its own "
        f"(env: {SERVER_URL_VARIABLE}; default: the embedded server of the demo extra)",
    )
    group.addoption(
        "--saga-database-url",
        default=None,
        help=f"one PostgreSQL database for saga.testing instead, emptied before each test: "
        f"created if missing, refused unless empty or the harness's own "
        f"(env: {DATABASE_URL_VARIABLE})",
    )
    group.addoption(
        "--saga-keep-database",
        action="store_true",
        default=False,
        help="keep the session's test database after the run, to look into it",
    )


@pytest.fixture(scope="session")
def saga_server_url(request: pytest.FixtureRequest) -> str | None:
    option: str | None = request.config.getoption("--saga-server-url")
    return option or os.environ.get(SERVER_URL_VARIABLE) or None


@pytest.fixture(scope="session")
def saga_database_url(request: pytest.FixtureRequest) -> str | None:
    option: str | None = request.config.getoption("--saga-database-url")
    return option or os.environ.get(DATABASE_URL_VARIABLE) or None


@pytest.fixture(scope="session")
def saga_database(
    request: pytest.FixtureRequest, saga_server_url: str | None, saga_database_url: str | None
) -> Iterator[HarnessDatabase]:
    if saga_database_url:
        yield HarnessDatabase(saga_database_url)
        return
    database = HarnessDatabase.create(saga_server_url)
    yield database
    if request.config.getoption("--saga-keep-database"):
        request.config.stash.setdefault(_KEPT, []).append(redact_url(database.url))
    else:
        database.close()


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


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    for url in config.stash.get(_KEPT, []):
        terminalreporter.write_line(f"saga.testing kept its test database: {url}")
