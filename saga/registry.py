"""The registry: the sagas whose home is one service, run as that service's consumer.

>>> registry = SagaRegistry("orders")                 # doctest: +SKIP
>>> registry.register(create_order)
>>> # saga consume orders.saga:registry
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg
from pydantic import BaseModel

from consumers.context import HandlerContext
from consumers.retry import RetryPolicy
from consumers.service import Service
from saga.definition import RemoteStep, Saga
from saga.envelope import message_type_of
from saga.errors import ConfigurationError
from saga.identifiers import validate_name, validate_schema
from saga.orchestrator import Orchestrator
from saga.outbox import Outbox
from saga.replies import Ack, FailureReply, ResumeSaga, StepTimer


class SagaRegistry:
    """Collects saga definitions and runs them as the ``service`` consumer.

    ``routes`` maps command types to the services that handle them, for
    remote steps declared without ``service=``.
    """

    def __init__(
        self,
        service: str,
        *,
        schema: str = "saga",
        routes: dict[type[BaseModel], str] | None = None,
        retry: RetryPolicy | None = None,
        outbox: Outbox | None = None,
    ) -> None:
        self.service_name = validate_name(service, "service name")
        self.schema = validate_schema(schema)
        self.routes = dict(routes or {})
        self.retry = retry or RetryPolicy()
        self.outbox = outbox or Outbox(self.schema)
        self._sagas: dict[str, dict[int, Saga[Any]]] = {}
        self._reply_types: dict[str, type[BaseModel]] = {
            message_type_of(m): m for m in (Ack, FailureReply, StepTimer, ResumeSaga)
        }
        self.orchestrator: Orchestrator = Orchestrator(self)
        self._service: Service | None = None

    def __repr__(self) -> str:
        return f"SagaRegistry({self.service_name!r}, sagas={sorted(self._sagas)})"

    def register(self, saga: Saga[Any]) -> Saga[Any]:
        """Check ``saga`` and make it runnable here; every mistake is reported now."""
        if self._service is not None:
            raise ConfigurationError("register every saga before the registry's service starts")
        saga.validate(self.routes)
        versions = self._sagas.setdefault(saga.name, {})
        if saga.version in versions:
            raise ConfigurationError(
                f"saga {saga.name!r} version {saga.version} is registered twice"
            )
        replies = [s.reply for s in saga.steps if isinstance(s, RemoteStep) and s.reply]
        for reply in replies:
            name = message_type_of(reply)
            known = self._reply_types.get(name)
            if known is not None and known is not reply:
                raise ConfigurationError(
                    f"reply type name {name!r} is used by two classes ({known!r} and {reply!r}); "
                    "set message_type on one of them"
                )
        for reply in replies:
            self._reply_types[message_type_of(reply)] = reply
        versions[saga.version] = saga
        saga.registry = self
        return saga

    def definition(self, name: str, version: int | None = None) -> Saga[Any]:
        """The registered saga ``name`` at ``version`` (the newest when None)."""
        versions = self._sagas.get(name)
        if not versions:
            raise ConfigurationError(f"no saga named {name!r} is registered with {self!r}")
        if version is None:
            return versions[max(versions)]
        if version not in versions:
            raise ConfigurationError(
                f"saga {name!r} version {version} is not registered (have {sorted(versions)})"
            )
        return versions[version]

    @property
    def sagas(self) -> list[Saga[Any]]:
        return [saga for versions in self._sagas.values() for saga in versions.values()]

    # -- app-facing calls ------------------------------------------------------

    def start(
        self,
        conn: psycopg.Connection[Any],
        saga: Saga[Any] | str,
        data: BaseModel,
        *,
        idempotency_key: str | None = None,
    ) -> UUID:
        """Start a saga in the caller's transaction; the same key twice gives the same id."""
        definition = self.definition(saga) if isinstance(saga, str) else saga
        if definition.registry is not self:
            raise ConfigurationError(f"saga {definition.name!r} is not registered with {self!r}")
        saga_id: UUID = self.orchestrator.start(conn, definition, data, idempotency_key)
        return saga_id

    def cancel(self, conn: psycopg.Connection[Any], saga_id: UUID, reason: str) -> None:
        """Ask a running saga to compensate from where it is (in the caller's transaction)."""
        self.orchestrator.cancel(conn, saga_id, reason)

    # -- the consumer ----------------------------------------------------------

    def as_service(self) -> Service:
        """The orchestrator as a service: ``saga consume module:registry`` runs this."""
        if self._service is None:
            service = Service(self.service_name, retry=self.retry)
            for message_class in self._reply_types.values():
                if message_class is StepTimer:
                    service.add_handler(StepTimer, self._on_timer)
                elif message_class is ResumeSaga:
                    service.add_handler(ResumeSaga, self._on_resume)
                else:
                    service.add_handler(message_class, self._on_reply)
            self._service = service
        return self._service

    def _on_reply(self, tx: psycopg.Connection[Any], reply: BaseModel, ctx: HandlerContext) -> None:
        self.orchestrator.on_reply(tx, reply, ctx.envelope, ctx.metrics)

    def _on_timer(self, tx: psycopg.Connection[Any], timer: StepTimer, ctx: HandlerContext) -> None:
        self.orchestrator.on_timer(tx, timer, ctx.envelope, ctx.metrics)

    def _on_resume(
        self, tx: psycopg.Connection[Any], request: ResumeSaga, ctx: HandlerContext
    ) -> None:
        self.orchestrator.on_resume(tx, request, ctx.metrics)
