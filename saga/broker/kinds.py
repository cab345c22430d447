"""Every kind of broker the framework runs on, and how a URL or a kombu connection
finds its own. A new broker is one more subpackage of ``saga.broker`` and one more
entry here (see docs/brokers.md)."""

from __future__ import annotations

from kombu import Connection

from saga.broker.amqp import AMQP
from saga.broker.kind import BrokerKind
from saga.broker.memory import MEMORY
from saga.broker.postgres import POSTGRES
from saga.broker.redis import REDIS
from saga.errors import ConfigurationError

KINDS: tuple[BrokerKind, ...] = (AMQP, REDIS, POSTGRES, MEMORY)
SUPPORTED_SCHEMES = tuple(scheme for kind in KINDS for scheme in kind.schemes)


def kind_of_scheme(scheme: str) -> BrokerKind:
    """The broker a URL scheme selects (``scheme`` checked as supported beforehand)."""
    return next(kind for kind in KINDS if scheme in kind.schemes)


def kind_of(connection: Connection) -> BrokerKind:
    """The broker a kombu connection talks to."""
    driver = connection.transport.driver_type
    for kind in KINDS:
        if kind.driver_type == driver:
            return kind
    raise ConfigurationError(f"kombu transport {driver!r} is not one the framework runs on")
