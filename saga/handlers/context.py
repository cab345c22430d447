"""What a handler knows about the delivery it handles, and how it sends messages."""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

from pydantic import BaseModel

from saga.effects.side_effects import SideEffects
from saga.errors import ConfigurationError
from saga.handlers.batching import StagedWrites
from saga.messaging.envelope import (
    COMPENSATES_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    JOINS_HEADER,
    STEP_HEADER,
    Envelope,
)
from saga.messaging.outbox import OutgoingMessage
from saga.observability.metrics import Metrics


class HandlerContext:
    """Passed to every handler as its third argument.

    Messages sent with :meth:`send` and events published with :meth:`publish` are
    written to the outbox in the same transaction as the handler's own writes, when
    the handler returns.
    """

    def __init__(
        self,
        envelope: Envelope,
        service: str,
        metrics: Metrics | None = None,
        effects: SideEffects | None = None,
        batch: StagedWrites | None = None,
    ) -> None:
        self.envelope = envelope
        #: The service's staged writes for this batch (services that write batches at once).
        self.batch = batch
        self.service = service
        self.metrics = metrics
        self._effects = effects
        self.outgoing: list[OutgoingMessage] = []
        #: The messages of :attr:`outgoing` sent with :meth:`reply`: kept with the inbox row,
        #: they answer a duplicate of this delivery again.
        self.replies: list[OutgoingMessage] = []

    def __repr__(self) -> str:
        return (
            f"HandlerContext(service={self.service!r}, type={self.envelope.type!r}, "
            f"message_id={self.envelope.message_id})"
        )

    @property
    def message_id(self) -> UUID:
        return self.envelope.message_id

    @property
    def saga_id(self) -> UUID | None:
        return self.envelope.saga_id

    @property
    def correlation_id(self) -> UUID | None:
        return self.envelope.correlation_id

    @property
    def attempt(self) -> int:
        """1 on the first delivery, higher on delayed retries of the same message."""
        return self.envelope.attempt

    @property
    def idempotency_key(self) -> str:
        """A key that is the same on every retry, redelivery and replay of this request.

        Pass it to external APIs (payment providers) so they apply it once.
        """
        return self.envelope.headers.get(IDEMPOTENCY_KEY_HEADER) or str(self.envelope.message_id)

    @property
    def compensated_key(self) -> str | None:
        """On a saga's compensation, the idempotency key of the step it undoes; else None.

        A compensation must tolerate "nothing to undo": the step's command may have
        failed, never run, or run with its answer lost. Use this key to look for what
        the command did (``ctx.effects``, an external API's lookup by idempotency key).
        """
        return self.envelope.headers.get(COMPENSATES_HEADER)

    @property
    def effects(self) -> SideEffects:
        """The guard for calls to the outside world, on this service's database::

        charge = ctx.effects.run(ctx.idempotency_key, call=lambda: api.charge(...))
        """
        if self._effects is None:
            raise ConfigurationError("side effects need the consumer runtime (saga consume)")
        return self._effects

    def send(
        self,
        message: BaseModel,
        *,
        to: str,
        deliver_after: datetime | timedelta | None = None,
        headers: dict[str, str] | None = None,
        reply_to: str | None = None,
    ) -> UUID:
        """Send ``message`` to service ``to``, caused by (and correlated with) this delivery."""
        envelope = self._caused(message, headers=headers, reply_to=reply_to)
        self.outgoing.append(OutgoingMessage(envelope, to, deliver_after))
        return envelope.message_id

    def _caused(
        self, message: BaseModel, *, headers: dict[str, str] | None, reply_to: str | None = None
    ) -> Envelope:
        """A new envelope for ``message``, caused by this delivery and in its conversation."""
        return Envelope.wrap(
            message,
            saga_id=self.envelope.saga_id,
            correlation_id=self.envelope.correlation_id,
            causation_id=self.envelope.message_id,
            reply_to=reply_to,
            headers=headers,
        )

    def publish(
        self,
        event: BaseModel,
        *,
        deliver_after: datetime | timedelta | None = None,
        headers: dict[str, str] | None = None,
    ) -> UUID:
        """Publish ``event`` to every service subscribing to its type, caused by (and
        correlated with) this delivery; it leaves only if the handler's transaction commits."""
        envelope = self._caused(event, headers=headers)
        self.outgoing.append(OutgoingMessage(envelope, None, deliver_after))
        return envelope.message_id

    def reply(self, message: BaseModel) -> UUID | None:
        """Send ``message`` to the sender's ``reply_to``; None when the sender asked for none.

        The reply names the step (and the step a compensation undoes) of the request, so
        a saga that has moved on still knows what a late answer is about, and how many
        replies its parallel group joins.
        """
        if not self.envelope.reply_to:
            return None
        headers = {
            name: value
            for name in (STEP_HEADER, COMPENSATES_HEADER, JOINS_HEADER)
            if (value := self.envelope.headers.get(name)) is not None
        }
        message_id = self.send(message, to=self.envelope.reply_to, headers=headers)
        self.replies.append(self.outgoing[-1])
        return message_id
