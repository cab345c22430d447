"""A service: a named set of handlers, one per message type, run by ``saga consume``.

Commands come to the service by name (its queue). Events come to every service that
subscribes to their type: ``@service.subscribe(OrderApproved)`` registers the handler and
binds the service's queue to the event, so each subscriber gets its own copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import psycopg
from pydantic import BaseModel

from saga.db.sql import validate_name
from saga.errors import ConfigurationError
from saga.handlers.batching import BatchWriting
from saga.handlers.retry import RetryPolicy
from saga.messaging.envelope import Envelope, message_type_of

if TYPE_CHECKING:
    from saga.handlers.context import HandlerContext

M = TypeVar("M", bound=BaseModel)

#: ``handler(tx, message, ctx)``: runs inside the delivery's transaction; its
#: return value (a message or None) is sent to the sender's ``reply_to``.
Handler = Callable[[psycopg.Connection[Any], Any, "HandlerContext"], BaseModel | None]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """One registered handler."""

    message_class: type[BaseModel]
    func: Handler
    retry: RetryPolicy

    @property
    def name(self) -> str:
        return getattr(self.func, "__qualname__", repr(self.func))


#: How long a consumer waits, by default, for the siblings of a reply that arrives alone
#: (:class:`ReplyJoining`).
DEFAULT_REPLY_LINGER = timedelta(milliseconds=5)


class ReplyJoining(Protocol):
    """Which deliveries have siblings on their way (the replies of a saga's parallel
    group): the consumer waits a moment for those before handling one alone."""

    #: the message types that may have siblings (checked before a body is decoded)
    types: frozenset[str]

    def more_to_come(self, envelope: Envelope) -> bool: ...


class Service:
    """Handlers for the messages sent to one destination (the service's queue).

    >>> customers = Service("customers")
    >>> @customers.handler(ReserveCredit)          # doctest: +SKIP
    ... def reserve(tx, cmd, ctx): ...
    """

    def __init__(self, name: str, *, retry: RetryPolicy | None = None) -> None:
        self.name = validate_name(name, "service name")
        self.retry = retry or RetryPolicy()
        self._handlers: dict[str, HandlerSpec] = {}
        self._subscribed: set[str] = set()
        self.connect_hooks: list[Callable[[psycopg.Connection[Any]], None]] = []
        #: Set by a service that stages a batch's writes and writes them at once.
        self.batch_writing: BatchWriting | None = None
        #: Set by a service whose replies come in groups (a saga registry with parallel steps).
        self.reply_joins: ReplyJoining | None = None
        #: The framework schema the handlers write to themselves (a saga registry's), if
        #: any: the consumer running them must use the same one.
        self.schema: str | None = None

    def __repr__(self) -> str:
        events = f", subscriptions={self.subscriptions}" if self._subscribed else ""
        return f"Service({self.name!r}, handlers={sorted(self._handlers)}{events})"

    def handler(
        self, message_class: type[M], *, retry: RetryPolicy | None = None
    ) -> Callable[[F], F]:
        """Decorator: register ``func`` as the handler of ``message_class``."""

        def register(func: F) -> F:
            self.add_handler(message_class, func, retry=retry)
            return func

        return register

    def subscribe(
        self, event_class: type[M], *, retry: RetryPolicy | None = None
    ) -> Callable[[F], F]:
        """Decorator: handle every published ``event_class`` event (``outbox.publish``,
        ``ctx.publish``), in this service's own transaction, once.

        The service's queue is bound to the event's type whenever a worker connects; it
        receives the events published from then on (not those published before its first
        connection). A subscriber's handler returns None: nobody waits for a reply.
        """

        def register(func: F) -> F:
            self.add_subscription(event_class, func, retry=retry)
            return func

        return register

    def add_subscription(
        self, event_class: type[BaseModel], func: Handler, *, retry: RetryPolicy | None = None
    ) -> None:
        """:meth:`subscribe` as a call: ``func`` handles the events of ``event_class``."""
        self.add_handler(event_class, func, retry=retry)
        self._subscribed.add(message_type_of(event_class))

    def add_handler(
        self,
        message_class: type[BaseModel],
        func: Handler,
        *,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not (isinstance(message_class, type) and issubclass(message_class, BaseModel)):
            raise ConfigurationError(
                f"handler message class must be a pydantic model, got {message_class!r}"
            )
        type_name = message_type_of(message_class)
        if type_name in self._handlers:
            existing = self._handlers[type_name]
            raise ConfigurationError(
                f"service {self.name!r} already has a handler for {type_name!r} ({existing.name})"
            )
        self._handlers[type_name] = HandlerSpec(message_class, func, retry or self.retry)

    def on_connect(self, hook: Callable[[psycopg.Connection[Any]], None]) -> None:
        """Run ``hook(conn)`` (in a transaction) when a worker connects, before consuming.

        A hook that raises :class:`~saga.errors.ConfigurationError` stops the service.
        """
        self.connect_hooks.append(hook)

    def handler_for(self, type_name: str) -> HandlerSpec | None:
        return self._handlers.get(type_name)

    @property
    def message_types(self) -> list[str]:
        return sorted(self._handlers)

    @property
    def subscriptions(self) -> list[str]:
        """The event types this service subscribes to (its queue's bindings)."""
        return sorted(self._subscribed)
