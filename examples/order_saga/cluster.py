"""The services of the example: their databases, processes and seed data.

The order saga's four (orders and its three participants), and the two that subscribe
to the events orders publishes (notifications, analytics).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from kombu import Connection

from saga.broker.transport import BrokerConfig, Topology, declare_subscriptions
from saga.db.connections import DIRECT, DatabaseAccess, Pooler, Wakeups
from saga.db.schema import migrate
from saga.settings import ENV_POOLER, ENV_WAKEUPS

#: The order saga's services: its home and its participants.
SAGA_SERVICES = ("orders", "customers", "inventory", "payments")
#: The services that only subscribe to the events orders publishes.
SUBSCRIBERS = ("notifications", "analytics")
SERVICES = SAGA_SERVICES + SUBSCRIBERS
TARGETS = {
    "orders": "saga.examples.order_saga.orders:registry",
    "customers": "saga.examples.order_saga.customers:service",
    "inventory": "saga.examples.order_saga.inventory:service",
    "payments": "saga.examples.order_saga.payments:service",
    "notifications": "saga.examples.order_saga.notifications:service",
    "analytics": "saga.examples.order_saga.analytics:service",
}
#: The settings of a process whose databases are behind a transaction pooler.
POOLED_ENV = {ENV_POOLER: Pooler.TRANSACTION.value, ENV_WAKEUPS: Wakeups.POLL.value}
SCHEMA_DIR = Path(__file__).resolve().parent / "schema"
#: "false": orders publishes no event (on a broker that carries commands only).
PUBLISH_EVENTS_VARIABLE = "ORDERS_PUBLISH_EVENTS"

#: Seed data. Failures come from the data, as they would in production.
RICH_CUSTOMERS = [f"c-{i:02d}" for i in range(20)]
BROKE_CUSTOMER = "c-broke"
COMMON_SKUS = [f"sku-{i:02d}" for i in range(10)]
RARE_SKU = "sku-rare"
CLOSED_REGION = "atlantis"
OPEN_REGIONS = ["north", "south", "east", "west"]
CREDIT_EACH = 10_000_000_000
STOCK_EACH = 1_000_000


@dataclass
class Cluster:
    """Where each service's database is, and how its processes reach the broker.

    The cluster runs the services it has a database for: all of :data:`SERVICES`, or the
    saga's alone (:data:`SAGA_SERVICES`, as the saga benchmark runs it). On Redis, which
    carries commands only, orders publishes no event and no subscriber runs.
    """

    database_urls: dict[str, str]
    broker_url: str
    queue_prefix: str = "saga."
    #: ``quorum`` on a RabbitMQ cluster (the processes get it in their ``extra_env``).
    queue_type: str = "classic"
    extra_env: dict[str, str] = field(default_factory=dict)
    #: The fake payment gateway (the outside world); a free local port when not given.
    gateway_port: int = 0
    #: Relay and consumer processes per service (as if on that many hosts).
    processes: int = 1
    #: Each consumer runs its service's relay in a thread (``saga consume --relay``)
    #: instead of a relay process beside it: half the processes.
    relay_in_consumer: bool = False
    #: How every process reaches the databases: directly, or through a transaction pooler
    #: (its processes then poll: nothing LISTENs through the pooler).
    access: DatabaseAccess = DIRECT

    def __post_init__(self) -> None:
        if not self.gateway_port:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                self.gateway_port = probe.getsockname()[1]

    @property
    def carries_events(self) -> bool:
        """False on Redis: it carries commands only (docs/events.md says why)."""
        return BrokerConfig(self.broker_url).capabilities.events

    @property
    def services(self) -> tuple[str, ...]:
        return tuple(
            s
            for s in SERVICES
            if s in self.database_urls and (self.carries_events or s not in SUBSCRIBERS)
        )

    @property
    def has_subscribers(self) -> bool:
        """True when the services subscribing to orders' events run in this cluster."""
        return all(s in self.services for s in SUBSCRIBERS)

    @property
    def broker(self) -> BrokerConfig:
        """The broker as this cluster's processes reach it (a PostgreSQL broker behind the
        pooler too, polling)."""
        pooled = self.access.pooled
        return BrokerConfig(self.broker_url, pooled=pooled, listen=not pooled)

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def prepare(self) -> None:
        """Migrate every database, create the business tables and bind the subscribers'
        queues (idempotent)."""
        for service in self.services:
            with self.connect(service) as conn:
                migrate(conn, "saga")
                conn.execute((SCHEMA_DIR / f"{service}.sql").read_bytes())
        self._seed()
        self._bind_subscribers()

    def _bind_subscribers(self) -> None:
        """Bind the subscribers' queues before any order is placed. A subscriber receives
        the events published after its queue is bound (its consumer does that when it
        connects), and the invariants expect a notice for every order from the first one,
        even when orders comes up before notifications."""
        if not self.has_subscribers:
            return
        from saga.examples.order_saga import analytics, notifications

        topology = Topology(queue_prefix=self.queue_prefix, queue_type=self.queue_type)
        with self.broker.connected() as conn:
            channel = conn.channel()
            for subscriber in (notifications.service, analytics.service):
                topology.queue(subscriber.name)(channel).declare()
                declare_subscriptions(channel, topology, subscriber.name, subscriber.subscriptions)

    def _seed(self) -> None:
        with self.connect("customers") as conn:
            conn.cursor().executemany(
                "INSERT INTO credit VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                [(c, CREDIT_EACH, CREDIT_EACH) for c in RICH_CUSTOMERS] + [(BROKE_CUSTOMER, 0, 0)],
            )
        with self.connect("inventory") as conn:
            conn.cursor().executemany(
                "INSERT INTO stock VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                [(s, STOCK_EACH, STOCK_EACH) for s in COMMON_SKUS] + [(RARE_SKU, 0, 0)],
            )
            conn.execute(
                "INSERT INTO closed_regions VALUES (%s) ON CONFLICT DO NOTHING", (CLOSED_REGION,)
            )

    def delete_queues(self) -> None:
        """Remove the services' queues from the broker (scratch runs clean up after themselves)."""
        delete_queues(self.broker, self.queue_prefix, self.services)

    def env(self, service: str) -> dict[str, str]:
        """The environment of a ``saga relay`` or ``saga consume`` process for ``service``."""
        return {
            "SAGA_DATABASE_URL": self.database_urls[service],
            "SAGA_BROKER_URL": self.broker_url,
            "SAGA_QUEUE_PREFIX": self.queue_prefix,
            "SAGA_QUEUE_TYPE": self.queue_type,
            "PAYMENT_GATEWAY_URL": self.gateway_url,
            **({} if self.carries_events else {PUBLISH_EVENTS_VARIABLE: "false"}),
            **(POOLED_ENV if self.access.pooled else {}),
            **self.extra_env,
        }

    def gateway_command(self) -> tuple[str, list[str], dict[str, str]]:
        """The fake payment gateway, a process of its own (not one of ours: never faulted)."""
        module = "saga.examples.order_saga.gateway"
        return ("gateway", [sys.executable, "-m", module, "--port", str(self.gateway_port)], {})

    def commands(self) -> list[tuple[str, list[str], dict[str, str]]]:
        """(name, arguments, environment) of every process: the gateway, then for each
        service :attr:`processes` relays and consumers (the first of each named without a
        number: ``orders-relay``, ``orders``, then ``orders-relay-2``, ``orders-2``...);
        with :attr:`relay_in_consumer`, the consumers alone, each relaying too."""
        result = [self.gateway_command()]
        consume = ["consume", "--relay"] if self.relay_in_consumer else ["consume"]
        for service in self.services:
            for n in range(1, self.processes + 1):
                suffix = f"-{n}" if n > 1 else ""
                if not self.relay_in_consumer:
                    result.append((f"{service}-relay{suffix}", ["relay"], self.env(service)))
                result.append(
                    (f"{service}{suffix}", [*consume, TARGETS[service]], self.env(service))
                )
        return result

    def connect(self, service: str, **kwargs: Any) -> psycopg.Connection[Any]:
        return self.access.connect(self.database_urls[service], **kwargs)


def delete_queues(
    broker: str | BrokerConfig, queue_prefix: str, destinations: Iterable[str]
) -> None:
    """Remove the queues of ``destinations`` under ``queue_prefix``, messages and all, and
    the events exchange."""
    topology = Topology(queue_prefix=queue_prefix)
    connection = broker.connect() if isinstance(broker, BrokerConfig) else Connection(broker)
    with connection as conn:
        channel = conn.channel()
        for destination in destinations:
            topology.queue(destination)(channel).delete()
        if conn.transport.driver_type == "amqp":  # elsewhere bindings go with their queues
            topology.events_exchange()(channel).delete()
