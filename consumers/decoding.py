"""Turning broker bytes into a typed message, or a clear rejection.

Everything here runs before any handler: a body that is too large, not JSON,
not an envelope, of an unknown type or with an invalid payload is rejected
with a reason, recorded as a dead letter and acknowledged, so it never blocks
the messages behind it. Nothing but JSON is ever decoded (no pickle), and a
signature is checked over the raw bytes before any of them is parsed (only the
size is looked at first, so no digest is computed over an oversized body).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from saga.errors import Rejection
from saga.handlers.service import HandlerSpec, Service
from saga.messaging.envelope import CONTENT_TYPE, Envelope


@dataclass(frozen=True, slots=True)
class Decoded:
    """A delivery that passed every check."""

    envelope: Envelope
    spec: HandlerSpec
    message: BaseModel


def decode(
    body: bytes,
    content_type: str | None,
    service: Service,
    max_bytes: int,
    authenticate: Callable[[bytes], None] | None = None,
    *,
    unreadable: str | None = None,
) -> Decoded:
    """Validate ``body`` for ``service``; raise :class:`Rejection` with the reason if unusable.

    ``unreadable`` says why the broker's client could not read the body (a compression
    header it does not know, a body that does not decompress): it is refused first.
    ``authenticate`` (a signature check, raising on a forgery) runs on the raw bytes once
    they are known not to be oversized, before anything parses them.
    """
    if unreadable is not None:
        raise Rejection("UndecodableBody", f"the broker's client could not read it: {unreadable}")
    if len(body) > max_bytes:
        raise Rejection("MessageTooLarge", f"body of {len(body)} bytes is over {max_bytes}")
    if authenticate is not None:
        authenticate(body)
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type != CONTENT_TYPE:
        raise Rejection(
            "ContentTypeRejected",
            f"content type {content_type!r} is not accepted; only {CONTENT_TYPE} is",
        )
    try:
        envelope = Envelope.from_bytes(body)
    except ValidationError as exc:
        raise Rejection("UndecodableBody", _summary(exc)) from None
    spec = service.handler_for(envelope.type)
    if spec is None:
        raise _refused(
            envelope,
            "UnknownMessageType",
            f"service {service.name!r} has no handler for message type {envelope.type!r}",
        )
    try:
        message = spec.message_class.model_validate(envelope.payload)
    except ValidationError as exc:
        raise _refused(envelope, "InvalidPayload", f"{envelope.type}: {_summary(exc)}") from None
    return Decoded(envelope, spec, message)


def _refused(envelope: Envelope, error_type: str, message: str) -> Rejection:
    """A rejection of a message whose envelope could be read, naming it."""
    return Rejection(
        error_type,
        message,
        message_id=envelope.message_id,
        message_type=envelope.type,
        saga_id=envelope.saga_id,
    )


def _summary(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    parts = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in errors[:5]]
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more
