"""The services' databases a dashboard reads, each labelled by its service, and a small
pool of connections to each."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from saga.db.connections import DIRECT, DatabaseAccess
from saga.db.sql import validate_name, validate_schema
from saga.errors import ConfigurationError, DatabaseUnavailable
from saga.observability.redaction import password_of, redact_text, redact_url


@dataclass(frozen=True, slots=True)
class ServiceDatabase:
    """One service's database: ``service`` labels it on every page."""

    service: str
    url: str
    schema: str = "saga"

    def __repr__(self) -> str:
        return f"ServiceDatabase({self.service!r}, {redact_url(self.url)!r}, {self.schema!r})"


def parse_databases(specs: Sequence[str], schema: str) -> list[ServiceDatabase]:
    """``SERVICE=URL`` (or a bare URL, labelled by its database name) per service."""
    validate_schema(schema)
    found: dict[str, ServiceDatabase] = {}
    for spec in specs:
        service, sep, url = spec.partition("=")
        if not sep or "://" in service:
            url, service = spec, urlsplit(spec).path.lstrip("/")
        if "://" not in url:
            raise ConfigurationError(
                f"{redact_url(spec)!r} is not SERVICE=URL (e.g. orders=postgresql://host/orders)"
            )
        validate_name(service, "service")
        if service in found:
            raise ConfigurationError(f"service {service!r} is given two databases")
        found[service] = ServiceDatabase(service, url, schema)
    if not found:
        raise ConfigurationError(
            "no database: give --database-url SERVICE=URL (repeat it for each service) "
            "or set SAGA_DATABASE_URL"
        )
    return list(found.values())


#: A page's query that runs longer is cancelled (a text search over a whole large table).
STATEMENT_TIMEOUT_S = 20


class Databases:
    """A pool of connections (autocommit) per service database, opened lazily; each
    statement is cancelled after :data:`STATEMENT_TIMEOUT_S`."""

    def __init__(
        self,
        databases: Sequence[ServiceDatabase],
        pool_size: int = 4,
        access: DatabaseAccess = DIRECT,
    ) -> None:
        self.by_service = {db.service: db for db in databases}
        self.access = access
        # A transaction pooler refuses the startup option: there the dashboard role's own
        # setting bounds its statements (ALTER ROLE ... SET statement_timeout).
        timeout = (
            {}
            if access.pooled
            else {"options": f"-c statement_timeout={STATEMENT_TIMEOUT_S * 1000}"}
        )
        self._pools = {
            db.service: ConnectionPool(
                db.url,
                min_size=1,
                max_size=pool_size,
                kwargs={"autocommit": True, **timeout, **access.connection_kwargs()},
                open=False,
                name=f"dashboard-{db.service}",
            )
            for db in databases
        }

    @property
    def services(self) -> list[str]:
        return list(self.by_service)

    def open(self) -> None:
        for pool in self._pools.values():
            pool.open(wait=False)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()

    def database(self, service: str) -> ServiceDatabase:
        if service not in self.by_service:
            raise ConfigurationError(
                f"no database for service {service!r}; known: {', '.join(self.by_service)}"
            )
        return self.by_service[service]

    @contextmanager
    def connect(self, service: str, timeout: float = 5.0) -> Iterator[psycopg.Connection[Any]]:
        """A connection to ``service``'s database, or :class:`DatabaseUnavailable`."""
        url = self.database(service).url
        try:
            with self._pools[service].connection(timeout=timeout) as conn:
                yield conn
        except (psycopg.OperationalError, PoolTimeout) as exc:
            text = redact_text(str(exc), password_of(url))
            raise DatabaseUnavailable(f"{service}: cannot reach its database: {text}") from None
