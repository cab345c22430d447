"""A local step: code run inside the orchestrator's own transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pydantic import BaseModel

from saga.engine.state import Phase
from saga.engine.steps.kind import StepKind
from saga.engine.steps.options import Condition, LocalAction, StepRetry
from saga.errors import StepFailed

if TYPE_CHECKING:
    from saga.engine.definition import Saga
    from saga.engine.transitions import Transition


@dataclass(frozen=True, slots=True)
class LocalStep(StepKind):
    """Code run inside the orchestrator's own transaction."""

    name: str
    action: LocalAction
    compensation: LocalAction | str | None = None
    when: Condition | None = None
    pivot: bool = False
    retry: StepRetry | None = None

    kind = "local"

    def begin(self, t: Transition) -> bool:
        ran = t.local_steps.run(self.action, t.data, compensation=False)
        if isinstance(ran.error, StepFailed):
            reason = f"{self.name}: {ran.error.reason}"
            t.log_step(self, Phase.FORWARD, "failed", ran.started, reason, ran.finished, 1)
            if t.saga.after_pivot(self.name):
                raise RuntimeError(
                    f"step {self.name!r} is after the pivot and may not fail: {reason}"
                ) from ran.error
            t.begin_compensation(reason, self)
            return False
        if ran.result is not None:
            t.set_data(ran.result, f"step {self.name!r}")
        t.log_step(self, Phase.FORWARD, "succeeded", ran.started, None, ran.finished, 1)
        t.record.completed_steps.append(self.name)
        return True

    def compensate(self, t: Transition, attempt: int, message_id: UUID | None = None) -> bool:
        action = t.saga.local_compensation_for(self)
        if action is None:
            return True
        ran = t.local_steps.run(action, t.data, compensation=True)
        if ran.error is not None:
            exc = ran.error
            reason = f"{self.name}: {type(exc).__name__}: {exc}"
            t.log_step(
                self, Phase.COMPENSATION, "failed", ran.started, reason, ran.finished, attempt
            )
            t.record.step = self.name
            t.record.step_attempt = attempt
            t.retry_or_give_up(self, Phase.COMPENSATION, reason)
            return False
        t.log_step(self, Phase.COMPENSATION, "succeeded", ran.started, None, ran.finished, attempt)
        return True

    def problems(
        self, saga: Saga[Any], index: int, routes: dict[type[BaseModel], str]
    ) -> list[str]:
        name = self.compensation
        if isinstance(name, str) and not saga.defines_local_compensation(name):
            return [
                f"step {self.name!r} names compensation {name!r}, "
                "which no @local_compensation defines"
            ]
        return []
