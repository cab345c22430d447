"""The kinds of step a saga is made of, each one class with the hooks the engine calls
(:class:`~saga.engine.steps.kind.StepKind`)."""

from __future__ import annotations

from saga.engine.steps.for_each import ForEach
from saga.engine.steps.local import LocalStep
from saga.engine.steps.parallel import ParallelGroup
from saga.engine.steps.remote import RemoteStep
from saga.engine.steps.wait import WaitStep

#: Every kind of step; ``match`` on it with ``assert_never`` where kinds must be told apart.
Step = LocalStep | RemoteStep | WaitStep | ParallelGroup | ForEach

__all__ = ["ForEach", "LocalStep", "ParallelGroup", "RemoteStep", "Step", "WaitStep"]
