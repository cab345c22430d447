"""The envelope: what every message looks like on the wire.

A message is a pydantic model (the payload); the envelope adds identity,
correlation and headers. Bodies are JSON only; nothing else is ever decoded.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from saga.messaging.ids import uuid7
from saga.observability import tracing

CONTENT_TYPE = "application/json"
CONTENT_ENCODING = "utf-8"

#: Header carrying how many times this message has been tried (ours, not the broker's).
ATTEMPT_HEADER = "attempt"

#: Header naming the saga step a command or timer belongs to.
STEP_HEADER = "step"

#: Header carrying the key a participant uses to make a step's effect idempotent.
IDEMPOTENCY_KEY_HEADER = "idempotency_key"

#: Header on a compensation: the idempotency key of the step it undoes. The participant
#: records that key as closed, and refuses a forward command for it that comes later.
COMPENSATES_HEADER = "compensates"

#: Header on a command and its reply: how many replies the step's parallel group joins,
#: the step's among them. A hint for the consumer of the saga's home: it waits a moment
#: for the siblings of a reply that arrives alone (saga.engine.reply_joins).
JOINS_HEADER = "joins"

#: Broker header (not part of the signed body): when the message's outbox row committed,
#: in epoch seconds, where its publisher knows it. For latency metrics only.
COMMITTED_AT_HEADER = "committed_at"


def message_type_of(model: type[BaseModel] | BaseModel) -> str:
    """The wire name of a message class: ``message_type`` if it sets one, else its class name."""
    cls = model if isinstance(model, type) else type(model)
    explicit = cls.__dict__.get("message_type")
    if isinstance(explicit, str) and explicit:
        return explicit
    return cls.__name__


class Envelope(BaseModel):
    """Identity, correlation and headers around one message's payload."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    message_id: UUID
    type: str
    saga_id: UUID | None = None
    correlation_id: UUID | None = None
    causation_id: UUID | None = None
    reply_to: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    created_at: datetime
    payload: dict[str, Any]

    content_type: ClassVar[str] = CONTENT_TYPE

    @classmethod
    def wrap(
        cls,
        message: BaseModel,
        *,
        message_id: UUID | None = None,
        saga_id: UUID | None = None,
        correlation_id: UUID | None = None,
        causation_id: UUID | None = None,
        reply_to: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Envelope:
        """Put ``message`` in a new envelope with a fresh UUIDv7 id."""
        mid = message_id or uuid7()
        headers = dict(headers or {})
        tracing.inject(headers)
        return cls(
            message_id=mid,
            type=message_type_of(message),
            saga_id=saga_id,
            correlation_id=correlation_id or mid,
            causation_id=causation_id,
            reply_to=reply_to,
            headers=headers,
            created_at=datetime.now(UTC),
            payload=message.model_dump(mode="json"),
        )

    def to_bytes(self) -> bytes:
        """Serialize to the exact bytes stored in the outbox and sent."""
        return self.__pydantic_serializer__.to_json(self)

    @classmethod
    def from_bytes(cls, body: bytes) -> Envelope:
        """Parse bytes received from the broker (raises ``pydantic.ValidationError``)."""
        return cls.model_validate_json(body)

    @property
    def attempt(self) -> int:
        """1 for a first delivery, n for the n-th try of the same message."""
        try:
            return max(1, int(self.headers.get(ATTEMPT_HEADER, "1")))
        except ValueError:
            return 1

    @property
    def step_key(self) -> str | None:
        """The idempotency key of a saga step's forward command; None for a compensation
        (it names the step it undoes instead) and for messages without a key."""
        if COMPENSATES_HEADER in self.headers:
            return None
        return self.headers.get(IDEMPOTENCY_KEY_HEADER)

    def with_headers(self, **headers: str) -> Envelope:
        """A copy with some headers set (the message id is kept)."""
        return self.model_copy(update={"headers": {**self.headers, **headers}})
