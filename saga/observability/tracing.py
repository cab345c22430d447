"""OpenTelemetry context in envelopes, so one trace spans a saga across services.

OpenTelemetry is optional: without ``opentelemetry-api`` installed (or with
no SDK configured, so no span is recording) every function here does nothing.
The W3C ``traceparent`` (and ``tracestate``) travel in the envelope headers:
written when a message is created, restored around each handler.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - exercised where OpenTelemetry is absent
    propagate = None  # type: ignore[assignment]
    trace = None  # type: ignore[assignment]

TRACEPARENT = "traceparent"


def available() -> bool:
    return trace is not None


def inject(headers: dict[str, str]) -> None:
    """Write the current trace context into ``headers`` (nothing if no span is active)."""
    if propagate is not None and TRACEPARENT not in headers:
        propagate.inject(headers)


@contextmanager
def span(
    name: str, *, headers: Mapping[str, str] | None = None, **attributes: Any
) -> Iterator[None]:
    """A span named ``name``; its parent comes from ``headers`` when they carry one."""
    if trace is None or propagate is None:
        yield
        return
    parent = propagate.extract(dict(headers)) if headers else None
    kind = trace.SpanKind.CONSUMER if headers is not None else trace.SpanKind.INTERNAL
    tracer = trace.get_tracer("saga")
    clean = {k: str(v) for k, v in (attributes or {}).items() if v is not None}
    with tracer.start_as_current_span(name, context=parent, kind=kind, attributes=clean):
        yield


def trace_id(headers: Mapping[str, str]) -> str | None:
    """The trace id carried by ``headers`` (the second field of ``traceparent``)."""
    parts = headers.get(TRACEPARENT, "").split("-")
    return parts[1] if len(parts) == 4 else None
