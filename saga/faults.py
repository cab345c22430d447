"""Named crash points for fault-injection tests.

``SAGA_FAULTS="relay.after_publish"`` makes the process kill itself with
SIGKILL the first time it reaches that point; ``name@3`` fires on the third
time; several points are comma-separated. Without the variable, a fault point
is a set lookup on an empty frozenset.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections import Counter

logger = logging.getLogger(__name__)

ENV_VAR = "SAGA_FAULTS"

#: Every fault point in the framework (the crash-point matrix covers each one).
FAULT_POINTS = (
    "relay.after_claim",
    "relay.after_publish",
    "relay.after_commit",
    "consumer.before_commit",
    "consumer.after_commit",
    "consumer.after_ack",
    "orchestrator.in_compensation",
    "side_effect.after_call",
)


def _parse(spec: str) -> dict[str, int]:
    points: dict[str, int] = {}
    for item in spec.split(","):
        name, _, nth = item.strip().partition("@")
        if not name:
            continue
        points[name] = int(nth) if nth else 1
    return points


_armed: dict[str, int] = _parse(os.environ.get(ENV_VAR, ""))
_names = frozenset(_armed)
_hits: Counter[str] = Counter()


def fault_point(name: str) -> None:
    """Kill this process with SIGKILL here if ``name`` is armed and its hit count is due."""
    if name not in _names:
        return
    _hits[name] += 1
    if _hits[name] == _armed[name]:
        sys.stderr.write(f"fault point {name} fired: SIGKILL\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
