"""The framework's own PostgreSQL broker (``postgresql://``, ``postgres://``): a message
table with leases (:mod:`saga.broker.postgres.transport`), events routed by a bindings
table in the same INSERT and handed back when none matches, delays of its own, and its
queues' figures by state (:mod:`saga.broker.postgres.queue_depths`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from kombu.transport import TRANSPORT_ALIASES

from saga.broker.bindings import Binding
from saga.broker.capabilities import Capabilities
from saga.broker.kind import BrokerKind
from saga.broker.postgres.publishing import broker_bindings
from saga.broker.postgres.queue_depths import table_queue_depths
from saga.broker.postgres.transport import DEFAULT_SCHEMA
from saga.broker.queue_depths import QueueDepth
from saga.db.connections import DatabaseAccess
from saga.errors import DatabaseUnavailable
from saga.observability.redaction import password_of, redact_text

if TYPE_CHECKING:
    from saga.broker.transport import BrokerConfig, Topology

TRANSPORT = "saga.broker.postgres.transport:Transport"
SCHEMES = ("postgresql", "postgres")
# A plain ``kombu.Connection("postgresql://...")`` finds the transport too.
for _scheme in SCHEMES:
    TRANSPORT_ALIASES[_scheme] = TRANSPORT


class PostgresBroker(BrokerKind):
    name = "PostgreSQL"
    schemes = SCHEMES
    driver_type = "postgresql"
    capabilities = Capabilities(
        multiple_ack=False,
        heartbeats=False,
        confirmed_publish=False,
        returns_unroutable=False,
        returns_unrouted_events=True,
        events=True,
        queue_details=True,
        delayed_delivery=True,
        routing_table=True,
    )

    def transport(self, scheme: str) -> str | None:
        return TRANSPORT

    def transport_options(self, config: BrokerConfig) -> dict[str, Any]:
        return {"lease": config.lease, "listen": config.listen, "pooled": config.pooled}

    def database(self, config: BrokerConfig) -> tuple[str, str] | None:
        return config.url, DEFAULT_SCHEMA

    def queue_depths(
        self,
        config: BrokerConfig,
        topology: Topology,
        destinations: Iterable[str],
        access: DatabaseAccess,
    ) -> dict[str, QueueDepth]:
        """Every queue in the broker's table, whoever's destination it is."""
        with _connected(config, access) as conn:
            return table_queue_depths(conn, DEFAULT_SCHEMA)

    def bindings(self, config: BrokerConfig, access: DatabaseAccess) -> list[Binding]:
        with _connected(config, access) as conn:
            return broker_bindings(conn, DEFAULT_SCHEMA)


@contextmanager
def _connected(config: BrokerConfig, access: DatabaseAccess) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the broker's database, or :class:`DatabaseUnavailable` saying why."""
    try:
        conn = access.connect(config.url, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        text = redact_text(str(exc), password_of(config.url))
        raise DatabaseUnavailable(f"cannot connect to the broker's PostgreSQL: {text}") from None
    with conn:
        yield conn


POSTGRES = PostgresBroker()
