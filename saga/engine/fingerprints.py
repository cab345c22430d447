"""A saga definition's shape, its fingerprint, and what changed between two shapes.

A running saga is stored at a step by name, with the names of the steps it completed.
Renaming, removing or reordering steps, or changing what a step is (its kind, the
pivot, whether it is compensated, the reply it waits for), under the same version
strands those sagas: the first to reach a step that is gone fails at run time. The
registry records each version's shape (``saga_definitions``) and refuses to start with
a different one while sagas of that version are unfinished (see
``SagaRegistry.check_versions``).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from saga.engine.steps.kind import StepShape

if TYPE_CHECKING:
    from saga.engine.definition import Saga

__all__ = ["StepShape", "describe_change", "fingerprint", "shape"]


def shape(saga: Saga[Any]) -> list[StepShape]:
    """What running instances of ``saga`` depend on, step by step, in order."""
    return [step.shape() for step in saga.steps]


def fingerprint(steps: list[StepShape]) -> str:
    """A short digest of a shape: equal shapes, equal fingerprints."""
    text = json.dumps(steps, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def describe_change(before: list[StepShape], after: list[StepShape]) -> str:
    """What differs between two shapes, in words (steps gone, new, moved or changed)."""
    old_names = [s["step"] for s in before]
    new_names = [s["step"] for s in after]
    changes: list[str] = []
    gone = [name for name in old_names if name not in new_names]
    new = [name for name in new_names if name not in old_names]
    if gone:
        changes.append(f"step(s) {', '.join(map(repr, gone))} removed or renamed")
    if new:
        changes.append(f"step(s) {', '.join(map(repr, new))} added")
    kept_before = [name for name in old_names if name in new_names]
    kept_after = [name for name in new_names if name in old_names]
    if kept_before != kept_after:
        order = f"{' > '.join(kept_before)} became {' > '.join(kept_after)}"
        changes.append(f"steps reordered ({order})")
    recorded = {s["step"]: s for s in before}
    for step in after:
        old = recorded.get(step["step"])
        if old is None or old == step:
            continue
        details = ", ".join(
            f"{key} {old.get(key)!r} became {step.get(key)!r}"
            for key in sorted(old.keys() | step.keys())
            if old.get(key) != step.get(key)
        )
        changes.append(f"step {step['step']!r}: {details}")
    return "; ".join(changes)
