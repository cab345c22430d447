"""Broker connections and topology, shared by the relay and the consumers.

:class:`BrokerConfig` is the broker seam's front: its URL's scheme picks a
:class:`~saga.broker.kind.BrokerKind` (one per subpackage or module of ``saga.broker``),
whose :class:`~saga.broker.capabilities.Capabilities` the relay, the consumers, the CLI
and the dashboard ask (docs/brokers.md).

Every destination (a service name) has one durable queue. Messages go to the
broker's default exchange with the queue name as routing key: on RabbitMQ a
``mandatory`` publish then detects a missing queue, and kombu's virtual
transports (Redis, memory, PostgreSQL) put the message straight on the
queue, with no binding table that a Redis restart could wipe.
Both the relay and consumers declare the queues they use, idempotently, on
every connect. On a RabbitMQ cluster the queues may be quorum queues
(``queue_type="quorum"``: replicated, and counting each message's deliveries in its
``x-delivery-count`` header, which the consumers' delivery limit reads); a broker URL
may list several nodes separated by ``;``, tried in turn on every connect.

Events have no destination: they go to one durable ``direct`` exchange,
``<queue_prefix>events``, with the event's type as routing key. Each subscribing
service's queue is bound to it once per event type it subscribes to; consumers
declare the exchange and their bindings on every connect (the relay declares the
exchange too, before it publishes an event). RabbitMQ keeps bindings with the
queues; the PostgreSQL transport keeps them in a table of its own. Redis is
commands only (:func:`check_events_supported`): its bindings live in keys that a
restart of a Redis without persistence wipes, and a publish that finds no binding
is dropped silently, so an event could be lost with no trace.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kombu import Connection, Exchange, Queue

from saga.broker.bindings import Binding
from saga.broker.capabilities import Capabilities
from saga.broker.kind import BrokerKind
from saga.broker.kinds import SUPPORTED_SCHEMES, kind_of, kind_of_scheme
from saga.broker.queue_depths import QueueDepth
from saga.broker.reconnect import transient_errors
from saga.db.connections import DIRECT, DatabaseAccess
from saga.db.sql import validate_name
from saga.errors import ConfigurationError, EventsNotSupported
from saga.observability.redaction import redact_url

#: RabbitMQ's queue types a destination's queue may have (``x-queue-type``).
QUEUE_TYPES = ("classic", "quorum")
#: The header a quorum queue sets on a redelivery: how many deliveries came back unsettled.
DELIVERY_COUNT_HEADER = "x-delivery-count"
#: Deliveries of one message a consumer may die on before it dead-letters the message.
DEFAULT_DELIVERY_LIMIT = 20


def delivery_count(headers: Mapping[str, Any] | None) -> int:
    """How many earlier deliveries of a message came back unsettled (0: its first delivery,
    or a broker that does not count them)."""
    count = (headers or {}).get(DELIVERY_COUNT_HEADER)
    return count if isinstance(count, int) else 0


@dataclass(frozen=True, slots=True)
class Topology:
    """How destinations map to queues: ``queue_prefix + destination``, of ``queue_type``."""

    queue_prefix: str = "saga."
    queue_arguments: dict[str, Any] = field(default_factory=dict)
    #: ``quorum``: replicated queues for a RabbitMQ cluster (other brokers ignore it).
    queue_type: str = "classic"

    def __post_init__(self) -> None:
        if self.queue_type not in QUEUE_TYPES:
            raise ConfigurationError(
                f"queue type {self.queue_type!r} is not one of {', '.join(QUEUE_TYPES)}"
            )

    @property
    def is_quorum(self) -> bool:
        return self.queue_type == "quorum"

    def queue_name(self, destination: str) -> str:
        return self.queue_prefix + validate_name(destination, "destination")

    def queue(self, destination: str) -> Queue:
        arguments = {**self.queue_arguments}
        if self.is_quorum:
            arguments["x-queue-type"] = "quorum"
        return Queue(
            self.queue_name(destination),
            durable=True,
            auto_delete=False,
            queue_arguments=arguments or None,
        )

    @property
    def events_exchange_name(self) -> str:
        """The exchange every event is published to, its type the routing key."""
        return self.queue_prefix + "events"

    def events_exchange(self) -> Exchange:
        return Exchange(self.events_exchange_name, type="direct", durable=True, auto_delete=False)


def check_events_supported(connection: Connection, what: str) -> None:
    """Raise :class:`EventsNotSupported` when ``connection``'s broker cannot carry events."""
    kind = kind_of(connection)
    if not kind.capabilities.events:
        raise EventsNotSupported(
            f"{what}: events need RabbitMQ or the PostgreSQL broker; on {kind.name}, kombu "
            "keeps the bindings in keys that a restart can wipe and drops a publish that finds "
            "no binding without a word, so an event could be lost with no trace. Use "
            f"{kind.name} for commands only (see docs/events.md)."
        )


def declare_subscriptions(
    channel: object,
    topology: Topology,
    destination: str,
    event_types: Sequence[str],
    dropped: Sequence[str] = (),
) -> None:
    """Declare the events exchange and bind ``destination``'s queue to each event type
    (idempotent: run on every connect); unbind it from the ``dropped`` ones."""
    exchange = topology.events_exchange()
    exchange(channel).declare()
    queue = topology.queue(destination)(channel)
    for event_type in event_types:
        queue.bind_to(exchange, routing_key=event_type)
    for event_type in dropped:
        queue.unbind_from(exchange, routing_key=event_type)


#: Seconds between AMQP heartbeats unless configured.
DEFAULT_HEARTBEAT = 20
#: Redis: seconds before a message taken by a consumer that died is delivered again.
DEFAULT_VISIBILITY_TIMEOUT = 300


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Where the broker is and how to talk to it."""

    url: str
    heartbeat: int = DEFAULT_HEARTBEAT
    connect_timeout: float = 10.0
    #: Redis: seconds before an unacknowledged message (its consumer died) is redelivered.
    visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT
    #: The memory transport: seconds between polls of an empty queue.
    polling_interval: float = 0.01
    #: PostgreSQL: seconds a consumer holds a message it took (renewed while it lives);
    #: a dead consumer's messages come back when it ends.
    lease: float = 30.0
    #: PostgreSQL: wake consumers with LISTEN/NOTIFY (False: poll only, for poolers).
    listen: bool = True
    #: PostgreSQL: the broker's database is behind a pooler in transaction mode (no
    #: prepared statements, no session state; it cannot LISTEN, so ``listen`` must be off).
    pooled: bool = False
    #: Run on a Redis that loses messages when it restarts (no append-only file, or one not
    #: synced on every write); refused otherwise (see :mod:`saga.broker.redis.durability`).
    accept_redis_message_loss: bool = False

    def __post_init__(self) -> None:
        if self.pooled and self.listen:
            raise ConfigurationError(
                "a PostgreSQL broker behind a transaction pooler cannot LISTEN: poll only "
                "(listen=False, SAGA_WAKEUPS=poll)"
            )
        schemes = {_scheme_of(url) for url in self.urls}
        if len(schemes) > 1:
            raise ConfigurationError(
                f"broker URL {redact_url(self.url)!r} lists nodes of different brokers "
                f"({', '.join(sorted(schemes))}): every node of a failover list must be the "
                "same kind of broker"
            )

    def __repr__(self) -> str:
        return f"BrokerConfig(url={redact_url(self.url)!r})"

    @property
    def urls(self) -> tuple[str, ...]:
        """The broker's nodes: ``url`` is one URL, or several separated by ``;`` (failover)."""
        return tuple(url.strip() for url in self.url.split(";"))

    @property
    def kind(self) -> BrokerKind:
        """The broker the URL's scheme selects."""
        return kind_of_scheme(_scheme_of(self.urls[0]))

    @property
    def capabilities(self) -> Capabilities:
        """What the broker can do: what the relay, the consumers and the tools ask."""
        return self.kind.capabilities

    def queue_depths(
        self,
        topology: Topology | None = None,
        destinations: Iterable[str] = (),
        access: DatabaseAccess = DIRECT,
    ) -> dict[str, QueueDepth]:
        """Queue name -> its messages: at least ``destinations``' queues (a broker whose
        capabilities have ``queue_details`` tells every queue it has)."""
        return self.kind.queue_depths(self, topology or Topology(), destinations, access)

    def bindings(self, access: DatabaseAccess = DIRECT) -> list[Binding]:
        """Every binding the broker routes events by (capabilities: ``routing_table``)."""
        return self.kind.bindings(self, access)

    @property
    def database(self) -> tuple[str, str] | None:
        """The PostgreSQL database (URL) and schema holding the broker's messages, if any."""
        return self.kind.database(self)

    def check_connected(self, connection: Connection) -> None:
        """Refuse a broker that could lose what it is given (checked on every connect)."""
        self.kind.check_connected(self, connection)

    def connected(self) -> Connection:
        """A connection to the first node that answers, trying every node once (from a
        random one, so that clients spread over a cluster's nodes); the last node's error
        when none does."""
        start = random.randrange(len(self.urls))
        order = [(start + step) % len(self.urls) for step in range(len(self.urls))]
        for node in order[:-1]:
            try:
                return self._connected_to(node)
            except transient_errors(self.connect(node)):
                continue
        return self._connected_to(order[-1])

    def _connected_to(self, node: int) -> Connection:
        connection = self.connect(node)
        try:
            connection.ensure_connection(max_retries=0)
        except BaseException:
            connection.close()
            raise
        return connection

    def connect(self, node: int = 0) -> Connection:
        """A new, not yet connected kombu connection to one node (the first by default).

        One node per connection, not kombu's failover list: a connection that fails over
        builds its next transport from the URL's scheme and drops the one chosen here.
        """
        return self.kind.connection(self, self.urls[node])


def _scheme_of(url: str) -> str:
    """The scheme of one node's URL, refused with the reason when it is not supported."""
    if not url:
        raise ConfigurationError(
            "broker URL list has an empty entry (a stray ';'): separate the nodes' URLs "
            "with ';', e.g. amqp://user:password@node1//;amqp://user:password@node2//"
        )
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme.startswith("sqla"):
        raise ConfigurationError(
            f"broker URL {redact_url(url)!r}: kombu's SQLAlchemy transport is no longer "
            "supported (it loses the messages of a consumer that dies); use the framework's "
            "own PostgreSQL transport: postgresql://user:password@host/database"
        )
    if scheme not in SUPPORTED_SCHEMES:
        raise ConfigurationError(
            f"broker URL {redact_url(url)!r} is not supported: use one of "
            + ", ".join(f"{s}://" for s in SUPPORTED_SCHEMES)
            + " (several nodes: separate their URLs with ';')"
        )
    return scheme
