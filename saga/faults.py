"""Named crash points for fault-injection tests.

``SAGA_FAULTS="relay.after_publish"`` makes the process kill itself with
SIGKILL the first time it reaches that point; ``name@3`` fires on the third
time; several points are comma-separated. ``name@2:hold`` holds the thread
that reaches the point instead, until the file named by
``SAGA_FAULTS_RELEASE`` exists: a test can then act while the process is at
that point (signal it, restart a server) and let it go on. Without the
variable, a fault point is a set lookup on an empty frozenset.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from saga.errors import ConfigurationError

logger = logging.getLogger(__name__)

ENV_VAR = "SAGA_FAULTS"
RELEASE_VAR = "SAGA_FAULTS_RELEASE"
HOLD = "hold"

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


@dataclass(frozen=True, slots=True)
class Armed:
    """What a point does, and on which hit."""

    nth: int
    hold: bool


def _parse(spec: str) -> dict[str, Armed]:
    points: dict[str, Armed] = {}
    for item in spec.split(","):
        target, _, action = item.strip().partition(":")
        name, _, nth = target.partition("@")
        if not name:
            continue
        if action not in ("", HOLD):
            raise ConfigurationError(f"{ENV_VAR}: {name} has no action {action!r} (only {HOLD})")
        if action == HOLD and not os.environ.get(RELEASE_VAR):
            raise ConfigurationError(f"{ENV_VAR}: {name}:{HOLD} needs {RELEASE_VAR}, a file path")
        points[name] = Armed(int(nth) if nth else 1, action == HOLD)
    return points


_armed: dict[str, Armed] = _parse(os.environ.get(ENV_VAR, ""))
_names = frozenset(_armed)
_hits: Counter[str] = Counter()


def fault_point(name: str) -> None:
    """Kill this process with SIGKILL here (or hold here) if ``name`` is armed and due."""
    if name not in _names:
        return
    _hits[name] += 1
    armed = _armed[name]
    if _hits[name] != armed.nth:
        return
    if armed.hold:
        _hold(name, Path(os.environ[RELEASE_VAR]))
        return
    sys.stderr.write(f"fault point {name} fired: SIGKILL\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _hold(name: str, release: Path) -> None:
    sys.stderr.write(f"fault point {name} holding until {release} exists\n")
    sys.stderr.flush()
    while not release.exists():
        time.sleep(0.01)
    sys.stderr.write(f"fault point {name} released\n")
    sys.stderr.flush()
