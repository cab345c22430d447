"""What steps of every kind are declared with: retries, option values, callables."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from saga.db.sql import Tx

#: ``on_timeout`` / ``on_deadline`` / ``on_dead_letter`` values.
COMPENSATE = "compensate"
RETRY = "retry"
HOLD = "hold"
LocalAction = Callable[[Tx, Any], BaseModel | None]
ReplyHandler = Callable[[Any, Any], BaseModel]
Condition = Callable[[Any], bool]
#: A key out of saga data or an event (compared as text).
KeyOf = Callable[[Any], object]


@dataclass(frozen=True, slots=True)
class StepRetry:
    """How often a step after the pivot, or a compensation, is tried again.

    Attempt ``n`` waits ``min(initial_delay * 2 ** (n - 1), max_delay)`` seconds.
    """

    attempts: int = 5
    initial_delay: float = 1.0
    max_delay: float = 60.0

    def delay(self, attempt: int) -> float:
        return float(min(self.initial_delay * 2 ** max(attempt - 1, 0), self.max_delay))
