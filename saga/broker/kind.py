"""A kind of broker behind the seam: the URL schemes that pick it, its kombu transport,
its :class:`~saga.broker.capabilities.Capabilities`, and the few things that differ from
one broker to the next (connection options, a start-up check, reading queue depths and
bindings).

Each broker is one subpackage or module of ``saga.broker`` holding one instance of a
subclass; :mod:`saga.broker.kinds` lists them. Nothing outside ``saga.broker`` asks which
kind it holds: it asks the capabilities.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kombu import Connection

from saga.broker.bindings import Binding
from saga.broker.capabilities import Capabilities
from saga.broker.queue_depths import QueueDepth, declared_depths
from saga.db.connections import DatabaseAccess
from saga.errors import ConfigurationError

if TYPE_CHECKING:
    from saga.broker.transport import BrokerConfig, Topology


class BrokerKind:
    """One kind of broker; subclasses set the class attributes and override what differs."""

    #: What operators call it, in messages.
    name: str
    #: The URL schemes that select it (lower case).
    schemes: tuple[str, ...]
    #: kombu's ``driver_type`` of its transport: how a kombu connection's kind is known.
    driver_type: str
    capabilities: Capabilities
    #: The client polls for messages (kombu's virtual transports): ``polling_interval`` applies.
    polls: bool = False

    def transport(self, scheme: str) -> str | None:
        """The kombu transport (``module:Class``) for ``scheme``; None: kombu's own."""
        return None

    def transport_options(self, config: BrokerConfig) -> dict[str, Any]:
        """kombu transport options drawn from ``config``."""
        return {}

    def connection(self, config: BrokerConfig, url: str) -> Connection:
        """A new, not yet connected kombu connection to the node at ``url``."""
        connection = Connection(
            url,
            heartbeat=config.heartbeat if self.capabilities.heartbeats else 0,
            connect_timeout=config.connect_timeout,
            transport=self.transport(url.split("://", 1)[0].lower()),
            transport_options=self.transport_options(config),
        )
        if self.polls:
            connection.transport.polling_interval = config.polling_interval
        return connection

    def check_connected(self, config: BrokerConfig, connection: Connection) -> None:
        """Refuse a broker that could lose what it is given, on every connect (raise
        :class:`~saga.errors.UnsafeDurability`); nothing to check by default."""

    def bindings(self, config: BrokerConfig, access: DatabaseAccess) -> list[Binding]:
        """Every binding the broker routes events by, on a broker whose capabilities have
        ``routing_table``."""
        raise ConfigurationError(f"{self.name} keeps no table of its bindings to list")

    def queue_depths(
        self,
        config: BrokerConfig,
        topology: Topology,
        destinations: Iterable[str],
        access: DatabaseAccess,
    ) -> dict[str, QueueDepth]:
        """Queue name -> its messages, as the broker tells them. By default the messages
        ready in each of ``destinations``' queues, from a passive declare (a queue the
        broker lacks is left out)."""
        return declared_depths(config, topology, destinations)

    def database(self, config: BrokerConfig) -> tuple[str, str] | None:
        """The PostgreSQL database (its URL) and schema the broker keeps its messages in,
        for the tools that watch its tables; None for a broker with a server of its own."""
        return None
