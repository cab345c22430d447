"""Optional transient failures, to watch retries work: ORDER_SAGA_FLAKINESS=0.05."""

from __future__ import annotations

import os
import random

RATE = float(os.environ.get("ORDER_SAGA_FLAKINESS", "0") or 0)


class TransientGlitch(ConnectionError):
    """Stands in for a network blip or a deadlock: the runtime retries it."""


def maybe_glitch(where: str) -> None:
    if RATE and random.random() < RATE:
        raise TransientGlitch(f"simulated transient failure in {where}")
