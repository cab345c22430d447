"""Without an OpenTelemetry SDK, a handler's span records nothing but carries the trace on."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
from opentelemetry import propagate, trace
from saga.observability import tracing

assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
incoming = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
with tracing.span("orders handle Reply", headers=incoming, attributes={"saga.id": "s"}):
    outgoing = {}
    propagate.inject(outgoing)
assert outgoing == incoming, outgoing
with tracing.span("no context", headers={}):
    outgoing = {}
    propagate.inject(outgoing)
assert outgoing == {}, outgoing
print("ok")
"""


def test_messages_sent_in_a_span_continue_the_incoming_trace() -> None:
    # A fresh interpreter: another test may have installed an SDK in this one.
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
