"""How a process opens its PostgreSQL connections: directly, or through a pooler.

A pooler in transaction mode (PgBouncer's ``pool_mode = transaction``) hands the
server connection to another client after every transaction, so nothing may
outlive one: no server-side prepared statements (PgBouncer 1.18 does not track
them: the next transaction may land on a server that never saw the ``PREPARE``),
no session ``SET``, no ``LISTEN``. Every connection the relay, the consumers, the
CLI, the metrics and the dashboard open goes through :class:`DatabaseAccess`,
which turns psycopg's prepared statements off behind such a pooler and says
where wake-ups come from: a ``LISTEN`` on a direct connection, or polling alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import psycopg

from saga.errors import ConfigurationError


class Pooler(StrEnum):
    """What stands between the process and PostgreSQL."""

    #: A direct connection (or a pooler in session mode): sessions are the process's own.
    NONE = "none"
    #: A pooler in transaction mode: nothing outlives a transaction.
    TRANSACTION = "transaction"


class Wakeups(StrEnum):
    """How a waiting relay (or PostgreSQL-broker consumer) learns of new rows early."""

    #: ``LISTEN`` for the writers' debounced ``NOTIFY``, polling as the fallback.
    LISTEN = "listen"
    #: Poll only, backing off while idle.
    POLL = "poll"


@dataclass(frozen=True, slots=True)
class DatabaseAccess:
    """The way to PostgreSQL, shared by every connection a process opens."""

    pooler: Pooler = Pooler.NONE
    wakeups: Wakeups = Wakeups.LISTEN
    #: A direct URL (past the pooler) for the ``LISTEN`` connection; None: the database URL.
    #: Left out of the repr: it may carry a password.
    listen_url: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.wakeups is Wakeups.POLL and self.listen_url:
            raise ConfigurationError(
                "SAGA_LISTEN_DATABASE_URL is set but SAGA_WAKEUPS=poll: nothing would listen "
                "on it; drop one of the two"
            )
        if self.pooled and self.wakeups is Wakeups.LISTEN and not self.listen_url:
            raise ConfigurationError(
                "SAGA_POOLER=transaction cannot LISTEN through the pooler (the server "
                "connection changes after every transaction, and notifications go with it): "
                "set SAGA_LISTEN_DATABASE_URL to a direct URL, or SAGA_WAKEUPS=poll"
            )

    @property
    def pooled(self) -> bool:
        """True behind a transaction-mode pooler."""
        return self.pooler is Pooler.TRANSACTION

    @property
    def listens(self) -> bool:
        return self.wakeups is Wakeups.LISTEN

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments every connection (or pool's connection) takes."""
        return {"prepare_threshold": None} if self.pooled else {}

    def connect(self, url: str, **kwargs: Any) -> psycopg.Connection[Any]:
        """A connection to ``url`` fit for this way to PostgreSQL."""
        return psycopg.connect(url, **self.connection_kwargs(), **kwargs)

    def connect_listener(self, url: str) -> psycopg.Connection[Any] | None:
        """An autocommit connection to ``LISTEN`` on (the direct URL if one is given),
        or None when this process polls."""
        if not self.listens:
            return None
        return psycopg.connect(self.listen_url or url, autocommit=True)


#: A direct connection, listening for wake-ups: the default.
DIRECT = DatabaseAccess()
#: Behind a transaction-mode pooler, polling for new rows.
POOLED_POLLING = DatabaseAccess(Pooler.TRANSACTION, Wakeups.POLL)
