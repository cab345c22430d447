"""Test fixtures: real servers, resolved as tests/support/servers.py describes.

A missing server fails the test under ``CI=true`` and skips it elsewhere,
with one summary line per missing server saying how to enable that tier.

Every test is marked with the servers it needs (``postgres``, ``rabbitmq``, ``redis``),
read from the fixtures it uses, so ``-m "not rabbitmq and not redis"`` selects the tier
that needs PostgreSQL at most (``make check``). ``--require-server postgres`` makes a
missing PostgreSQL stop the run at once with one clear line instead of skipping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import psycopg
import pytest

from saga.examples.order_saga.cluster import Cluster
from tests.rig.pgbouncer_server import PgBouncerServer, pgbouncer_program
from tests.rig.redis_server import RedisServer
from tests.support import sagas, servers, services
from tests.support.brokers import TestBroker
from tests.support.databases import DatabaseFactory, TestDatabase, with_database
from tests.support.example_cluster import make_cluster

PG_BROKER_DATABASE = "saga_test_broker"
_resolved: dict[str, servers.Server] = {}

#: The mark a test gets when it uses the fixture (or one that depends on it).
SERVER_FIXTURES = {
    "postgres_url": "postgres",
    "amqp_url": "rabbitmq",
    "redis_url": "redis",
    "private_redis": "redis",
}
#: The mark a test gets from the transport its broker fixture was parametrized with.
BROKER_PARAMS = {"amqp": "rabbitmq", "redis": "redis", "postgres": "postgres"}
BROKER_FIXTURES = ("any_broker", "event_broker", "shared_event_broker")
#: ``--require-server`` names, as the markers spell them: (key in ``_resolved``, server kind).
REQUIRABLE = {
    "postgres": ("postgres", "PostgreSQL"),
    "rabbitmq": ("amqp", "RabbitMQ"),
    "redis": ("redis", "Redis"),
}


MARKS = {
    "slow": "takes long (processes, chaos runs, wheels): make test runs it, make check does not",
    "postgres": "needs PostgreSQL (set from the fixtures the test uses)",
    "rabbitmq": "needs RabbitMQ (set from the fixtures the test uses)",
    "redis": "needs Redis (set from the fixtures the test uses)",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in MARKS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-server",
        action="append",
        default=[],
        choices=sorted(REQUIRABLE),
        help="stop the run at once if this server is missing (never skip, never embedded)",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    for name in session.config.getoption("require_server"):
        key, kind = REQUIRABLE[name]
        servers.REQUIRED.add(kind)
        server = _resolved[key] = _resolve(key)
        if server.url is None:
            pytest.exit(
                f"{server.kind} is required (--require-server {name}) and not available: "
                f"{server.how_to_enable}",
                returncode=pytest.ExitCode.USAGE_ERROR,
            )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for mark in _servers_needed(item):
            item.add_marker(mark)


def _servers_needed(item: pytest.Item) -> set[str]:
    fixtures = set(getattr(item, "fixturenames", ()))
    needed = {mark for fixture, mark in SERVER_FIXTURES.items() if fixture in fixtures}
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    for fixture in BROKER_FIXTURES:
        if params.get(fixture) in BROKER_PARAMS:
            needed.add(BROKER_PARAMS[params[fixture]])
    return needed


def _resolve(kind: str) -> servers.Server:
    return {"postgres": servers.postgres, "amqp": servers.rabbitmq, "redis": servers.redis}[kind]()


def _server(kind: str) -> str:
    if kind not in _resolved:
        _resolved[kind] = _resolve(kind)
    server = _resolved[kind]
    if server.url is None:
        servers.unavailable(server.kind, server.how_to_enable)
    return server.url


@pytest.fixture(autouse=True)
def _fresh_counters() -> None:
    """Tries counted by the test handlers in this process start from zero in every test."""
    sagas.reset_counters()
    services.reset_counters()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    return _server("postgres")


@pytest.fixture(scope="session")
def amqp_url() -> str:
    return _server("amqp")


@pytest.fixture(scope="session")
def redis_url() -> str:
    return _server("redis")


@pytest.fixture(scope="session")
def database_factory(postgres_url: str) -> Iterator[DatabaseFactory]:
    factory = DatabaseFactory(postgres_url)
    yield factory
    factory.close()


@pytest.fixture(scope="session")
def saga_server_url(postgres_url: str) -> str:
    """saga.testing's harness (its pytest plugin) makes a database of its own on the test server."""
    return postgres_url


@pytest.fixture(scope="session")
def saga_database_url() -> None:
    """Never one database as is: here SAGA_TEST_DATABASE_URL names the test server."""
    return None


@pytest.fixture
def db(database_factory: DatabaseFactory) -> Iterator[TestDatabase]:
    """A fresh database with the framework's tables (schema ``saga``)."""
    database = database_factory.create()
    yield database
    database_factory.drop(database.name)


@pytest.fixture
def empty_db(database_factory: DatabaseFactory) -> Iterator[TestDatabase]:
    """A fresh database with nothing in it."""
    database = database_factory.create_empty()
    yield database
    database_factory.drop(database.name)


@pytest.fixture(scope="session")
def pgbouncer(postgres_url: str) -> Iterator[PgBouncerServer]:
    """A private PgBouncer in transaction mode in front of the test PostgreSQL."""
    program = servers.pgbouncer(pgbouncer_program())
    backend = urlsplit(postgres_url)
    with PgBouncerServer(
        backend.hostname or "127.0.0.1",
        backend.port or 5432,
        users=(backend.username or "postgres",),
        program=program,
    ) as bouncer:
        yield bouncer


@pytest.fixture
def rabbit(amqp_url: str) -> Iterator[TestBroker]:
    broker = TestBroker(amqp_url, "amqp")
    yield broker
    broker.cleanup()


@pytest.fixture
def order_system(database_factory: DatabaseFactory, rabbit: TestBroker) -> Iterator[Cluster]:
    """The order-saga example on four fresh databases and the test RabbitMQ (nothing running)."""
    system, names = make_cluster(database_factory, rabbit)
    yield system
    for name in names:
        database_factory.drop(name)


@pytest.fixture
def private_redis() -> Iterator[Callable[..., RedisServer]]:
    """Starts private ``redis-server`` processes (which a test may crash) on free ports.

    Call it with ``persistent=True`` (appendonly yes, appendfsync always) or False.
    """
    servers.require_program("redis-server", servers.REDIS_SERVER_HINT)
    servers_started: list[RedisServer] = []

    def start(*, persistent: bool, extra_args: tuple[str, ...] = ()) -> RedisServer:
        server = RedisServer(persistent=persistent, extra_args=extra_args)
        servers_started.append(server)
        server.start()
        return server

    yield start
    for server in servers_started:
        server.close()


def _postgres_broker_url() -> str:
    """A database of its own on the test PostgreSQL for the PostgreSQL broker's table."""
    url = with_database(_server("postgres"), PG_BROKER_DATABASE)
    try:
        with psycopg.connect(_server("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {PG_BROKER_DATABASE}")
    except psycopg.errors.DuplicateDatabase:
        pass
    return url


@pytest.fixture(scope="session")
def pg_broker_url(postgres_url: str) -> str:
    return _postgres_broker_url()


@pytest.fixture
def pg_broker(pg_broker_url: str) -> Iterator[TestBroker]:
    """The PostgreSQL broker on its own database, with queues of this test's own."""
    broker = TestBroker(pg_broker_url, "postgres")
    yield broker
    broker.cleanup()


def _test_broker(kind: str) -> TestBroker:
    if kind == "memory":
        url = "memory://"
    elif kind == "amqp":
        url = _server("amqp")
    elif kind == "postgres":
        url = _postgres_broker_url()
    else:
        url = _server("redis")
    # The shared Redis runs with appendonly no (CI starts it so): accept that explicitly.
    return TestBroker(url, kind, accepts_message_loss=kind == "redis")


@pytest.fixture
def make_broker() -> Iterator[Callable[[str], TestBroker]]:
    """Makes a broker of a kind (``amqp``, ``redis``, ``postgres``) on its test server, with
    queues of its own, cleaned up afterwards (the contract suite's subclasses use it)."""
    made: list[TestBroker] = []

    def make(kind: str) -> TestBroker:
        made.append(_test_broker(kind))
        return made[-1]

    yield make
    for broker in made:
        broker.cleanup()


@pytest.fixture(params=["memory", "amqp", "redis", "postgres"])
def any_broker(request: pytest.FixtureRequest) -> Iterator[TestBroker]:
    """Each test using it runs once per transport (the contract suite)."""
    broker = _test_broker(request.param)
    yield broker
    broker.cleanup()


@pytest.fixture(params=["memory", "amqp", "postgres"])
def event_broker(request: pytest.FixtureRequest) -> Iterator[TestBroker]:
    """Each test using it runs once per transport that carries events (Redis does not)."""
    broker = _test_broker(request.param)
    yield broker
    broker.cleanup()


@pytest.fixture(params=["amqp", "postgres"])
def shared_event_broker(request: pytest.FixtureRequest) -> Iterator[TestBroker]:
    """The transports whose bindings several processes share: RabbitMQ and PostgreSQL."""
    broker = _test_broker(request.param)
    yield broker
    broker.cleanup()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for kind, hint in sorted(servers.MISSING.items()):
        terminalreporter.write_line(
            f"NOT RUN: tests needing {kind} were skipped; to run them, {hint}", yellow=True
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    servers.stop_containers()
