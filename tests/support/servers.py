"""Finding the servers a test tier needs, in this order:

1. a URL from the environment (``SAGA_TEST_DATABASE_URL``, ``SAGA_TEST_AMQP_URL``,
   ``SAGA_TEST_REDIS_URL``);
2. the local default address, if something answers there;
3. testcontainers, when a Docker engine answers and ``SAGA_TEST_CONTAINERS=1``;
4. for PostgreSQL alone, the embedded server used by ``make demo`` (never under
   ``CI=true`` nor when the run requires PostgreSQL with ``--require-server``: such a
   run tests the server it was given, or fails).

A URL from the environment that does not answer counts as missing. A missing
server (or program) fails the test under ``CI=true``, naming it, and skips it
elsewhere (:func:`unavailable`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pytest


@dataclass(frozen=True)
class Server:
    kind: str
    url: str | None
    source: str
    how_to_enable: str


_started: list[Any] = []  # containers to stop at exit

REDIS_SERVER_HINT = "install redis-server (apt-get install redis-server)"
PGBOUNCER_HINT = "install pgbouncer (apt-get install pgbouncer)"
RABBITMQCTL_HINT = "install rabbitmq-server (rabbitmqctl) on the machine running the tests"
PG_CTLCLUSTER_HINT = "install postgresql-common (pg_ctlcluster) on the machine running the tests"

#: Server kinds ("PostgreSQL", ...) the run requires (``--require-server``): a missing one
#: stops the run, and the embedded PostgreSQL never stands in for it.
REQUIRED: set[str] = set()

#: What was skipped for want of a server or program, and how to enable it (summary lines).
MISSING: dict[str, str] = {}


def on_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(what: str, hint: str) -> NoReturn:
    """Fail the test under ``CI=true`` (naming ``what``), skip it elsewhere."""
    message = f"{what} is not available: {hint}"
    if on_ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    MISSING[what] = hint
    pytest.skip(message)


def require_program(name: str, hint: str) -> str:
    """The path of an executable a test needs; a missing one is :func:`unavailable`."""
    path = shutil.which(name)
    if path is None:
        unavailable(name, hint)
    return path


def pgbouncer(installed: str | None) -> str:
    """The PgBouncer program: ``SAGA_TEST_PGBOUNCER`` if set, else the ``installed`` one;
    one that cannot run is :func:`unavailable`."""
    program = os.environ.get("SAGA_TEST_PGBOUNCER") or installed
    if program is None or not os.access(program, os.X_OK):
        unavailable("pgbouncer", PGBOUNCER_HINT)
    return program


def _answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 1.0
        ):
            return True
    except OSError:
        return False


def _docker_available() -> bool:
    if os.environ.get("SAGA_TEST_CONTAINERS") != "1":
        return False
    try:
        probe = subprocess.run(["docker", "info"], check=False, capture_output=True, timeout=10)
        return probe.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _container(factory: Callable[[], Any], to_url: Callable[[Any], str]) -> str | None:
    try:
        container = factory()
        container.start()
    except Exception:
        return None
    _started.append(container)
    return to_url(container)


def _postgres_container() -> str | None:
    from testcontainers.postgres import PostgresContainer

    return _container(
        lambda: PostgresContainer("postgres:15", driver=None),
        lambda c: c.get_connection_url(),
    )


def _rabbitmq_container() -> str | None:
    from testcontainers.rabbitmq import RabbitMqContainer

    return _container(
        lambda: RabbitMqContainer("rabbitmq:3.13"),
        lambda c: f"amqp://guest:guest@{c.get_container_host_ip()}:{c.get_exposed_port(5672)}//",
    )


def _redis_container() -> str | None:
    from testcontainers.redis import RedisContainer

    return _container(
        lambda: RedisContainer("redis:7"),
        lambda c: f"redis://{c.get_container_host_ip()}:{c.get_exposed_port(6379)}/0",
    )


def _embedded_postgres() -> str | None:
    try:
        from saga.db.embedded import EmbeddedPostgres
    except ImportError:
        return None
    try:
        server = EmbeddedPostgres.shared()
    except Exception:
        return None
    return server.url("postgres")


def resolve(
    kind: str,
    env_var: str,
    default_url: str,
    default_port: int,
    container: Callable[[], str | None],
    fallback: Callable[[], str | None] | None = None,
) -> Server:
    hint = (
        f"set {env_var}, start {kind} on {default_url}, or set SAGA_TEST_CONTAINERS=1 with Docker"
    )
    if os.environ.get(env_var):
        url = os.environ[env_var]
        if _answers(url, default_port):
            return Server(kind, url, "environment", hint)
        where = urlsplit(url)
        return Server(
            kind,
            None,
            "missing",
            f"nothing answers at {where.hostname}:{where.port or default_port} ({env_var})",
        )
    if _answers(default_url, default_port):
        return Server(kind, default_url, "local", hint)
    if _docker_available():
        url = container()
        if url:
            return Server(kind, url, "testcontainers", hint)
    if fallback is not None and not on_ci() and kind not in REQUIRED:
        url = fallback()
        if url:
            return Server(kind, url, "embedded", hint)
    return Server(kind, None, "missing", hint)


def postgres() -> Server:
    return resolve(
        "PostgreSQL",
        "SAGA_TEST_DATABASE_URL",
        "postgresql://postgres@127.0.0.1:5432/postgres",
        5432,
        _postgres_container,
        _embedded_postgres,
    )


def rabbitmq() -> Server:
    return resolve(
        "RabbitMQ",
        "SAGA_TEST_AMQP_URL",
        "amqp://guest:guest@127.0.0.1:5672//",
        5672,
        _rabbitmq_container,
    )


def redis() -> Server:
    return resolve(
        "Redis", "SAGA_TEST_REDIS_URL", "redis://127.0.0.1:6379/0", 6379, _redis_container
    )


def stop_containers() -> None:
    while _started:
        with contextlib.suppress(Exception):
            _started.pop().stop()
