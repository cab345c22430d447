"""Reading what ``saga demo`` printed: its submission, its outcomes and its invariant report
(which Rich may wrap over several lines)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SUBMITTED = re.compile(r"submitting orders\s.*?(\d+)/(\d+)\s+(\d+):(\d\d):(\d\d)")
_OUTCOME = re.compile(r"│ (completed|compensated|running|compensating)\s*│\s*(\d+) │")
_INVARIANTS = re.compile(r"business invariants hold \(([^)]*)\)")
_TIMELINE = re.compile(r"create_order v\d+\s+[0-9a-f-]{36}\s+(completed|compensated)")


@dataclass(frozen=True)
class DemoRun:
    submitted: int
    to_submit: int
    #: Seconds the submission took, as the progress bar shows them (whole seconds, floored).
    submitting_s: int
    outcomes: dict[str, int]
    invariants: dict[str, int]
    timelines: list[str]


def read_demo(out: str) -> DemoRun:
    submitted = _SUBMITTED.search(out)
    assert submitted is not None, out[-3000:]
    done, total, hours, minutes, seconds = (int(g) for g in submitted.groups())
    report = _INVARIANTS.search(out)
    assert report is not None, out[-3000:]  # the demo printed violations instead
    figures = dict(item.strip().split("=") for item in report.group(1).split(","))
    return DemoRun(
        submitted=done,
        to_submit=total,
        submitting_s=hours * 3600 + minutes * 60 + seconds,
        outcomes={status: int(n) for status, n in _OUTCOME.findall(out)},
        invariants={name: int(value) for name, value in figures.items()},
        timelines=_TIMELINE.findall(out),
    )


def assert_settled(run: DemoRun, orders: int) -> None:
    """Every order submitted and finished, the outcomes table and the invariant report
    agreeing, no effect applied twice and none missing."""
    assert run.submitted == run.to_submit == orders, run
    assert set(run.outcomes) == {"completed", "compensated"}, run.outcomes  # none left running
    assert run.outcomes["completed"] + run.outcomes["compensated"] == orders, run.outcomes
    figures = run.invariants
    assert figures["sagas_completed"] == run.outcomes["completed"], figures
    assert figures["sagas_compensated"] == run.outcomes["compensated"], figures
    assert figures["sagas_running"] == figures["sagas_compensating"] == 0, figures
    duplicates = {name: n for name, n in figures.items() if name.startswith("duplicate_")}
    assert duplicates and set(duplicates.values()) == {0}, figures
    assert figures["notices"] == orders, figures  # one notice per order, approved or rejected
    assert figures["notices_duplicated"] == figures["notices_missing"] == 0, figures
    assert sorted(run.timelines) == ["compensated", "completed"], run.timelines
