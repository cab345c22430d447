"""OpenTelemetry context in envelopes, so one trace spans a saga across services.

OpenTelemetry is optional: without ``opentelemetry-api`` installed (or with
no SDK configured, so no span is recording) every function here does nothing.
The W3C ``traceparent`` (and ``tracestate``) travel in the envelope headers:
written when a message is created, restored around each handler.

Span attributes use OpenTelemetry's messaging semantic conventions where they
name the thing, and ``saga.*`` for the rest (docs/operations.md, "Tracing").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import Token
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - exercised where OpenTelemetry is absent
    otel_context = None  # type: ignore[assignment]
    propagate = None  # type: ignore[assignment]
    trace = None  # type: ignore[assignment]

TRACEPARENT = "traceparent"

#: Span attribute names, in one place so every span spells them alike.
SAGA_ID = "saga.id"
SAGA_NAME = "saga.name"
SAGA_STEP = "saga.step"
MESSAGE_TYPE = "saga.message.type"  # no semantic convention names a message's type
MESSAGE_ID = "messaging.message.id"
CONVERSATION_ID = "messaging.message.conversation_id"  # the envelope's correlation id
DESTINATION = "messaging.destination.name"
CONSUMER_GROUP = "messaging.consumer.group.name"
OPERATION_TYPE = "messaging.operation.type"

AttributeValue = str | bool | int | float


def available() -> bool:
    return trace is not None


def records_spans() -> bool:
    """Whether spans started here are recorded (an OpenTelemetry SDK is configured)."""
    return trace is not None and not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider
    )


def inject(headers: dict[str, str]) -> None:
    """Write the current trace context into ``headers`` (nothing if no span is active)."""
    if propagate is not None and TRACEPARENT not in headers:
        propagate.inject(headers)


@contextmanager
def span(
    name: str,
    *,
    headers: Mapping[str, str] | None = None,
    attributes: Mapping[str, object] | None = None,
) -> Iterator[None]:
    """A span named ``name``; its parent comes from ``headers`` when they carry one.

    ``attributes`` are set on the span: None values are left out, values other than
    str, bool, int and float (a UUID) are written as strings.
    """
    if trace is None or propagate is None:
        yield
        return
    if not records_spans():
        # No SDK in this process: no span records anything. Carry the caller's trace
        # context through, so messages sent meanwhile continue its trace.
        token = _attach(headers)
        try:
            yield
        finally:
            if token is not None:
                otel_context.detach(token)
        return
    parent = propagate.extract(dict(headers)) if headers else None
    kind = trace.SpanKind.CONSUMER if headers is not None else trace.SpanKind.INTERNAL
    tracer = trace.get_tracer("saga")
    clean = {k: _value(v) for k, v in (attributes or {}).items() if v is not None}
    with tracer.start_as_current_span(name, context=parent, kind=kind, attributes=clean):
        yield


def _attach(headers: Mapping[str, str] | None) -> Token[Any] | None:
    """Make the trace context carried by ``headers`` current, if they carry one; the token
    to detach it with (None: nothing attached). A plain call, not a context manager: it
    runs for every delivery."""
    if not headers or TRACEPARENT not in headers or otel_context is None:
        return None
    return otel_context.attach(propagate.extract(dict(headers)))


def _value(value: object) -> AttributeValue:
    return value if isinstance(value, str | bool | int | float) else str(value)


def trace_id(headers: Mapping[str, str]) -> str | None:
    """The trace id carried by ``headers`` (the second field of ``traceparent``)."""
    parts = headers.get(TRACEPARENT, "").split("-")
    return parts[1] if len(parts) == 4 else None
