"""A saga's timeline as an operator reads it: every step attempt with its true number
of tries and its true duration, and the time the saga spent held for an operator or
waiting drawn as a wait, never as a step's duration.

The step log writes a step that succeeded after a hold with the time its command was
first sent, so read alone it would say the step took the whole hold. The step's dead
letter (same message id, from the participant's database) tells how many times the
participant tried it and when the operator replayed it: the hold is cut out of the
step and drawn as a wait of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from saga.engine.state import SagaRecord
from saga.messaging.dead_letters import DeadLetterRow

#: Outcomes drawn as a failure.
_FAILED = ("failed", "timed_out", "deadline_exceeded", "held")
_BAR_COLOURS = {
    "forward": "#3b82f6",
    "compensation": "#a855f7",
    "retrying": "#f59e0b",
    "failed": "#dc2626",
    "waiting": "#9ca3af",
}
#: A wait longer than this share of the saga's working time is drawn shortened (its
#: true length in its label), so that the steps around it stay visible.
_FOLDED_SHARE = 0.25
_MIN_FOLDED_MS = 5.0


@dataclass(frozen=True, slots=True)
class TimelineRow:
    """One attempt of a step, or one wait (``phase`` "wait")."""

    step: str
    phase: str
    tries: int | None
    outcome: str
    started_at: datetime
    finished_at: datetime
    offset_ms: float
    duration_ms: float
    error: str | None
    message_id: UUID | None
    note: str = ""
    #: the parallel group whose member this forward attempt is (drawn as a branch of it)
    group: str | None = None

    @property
    def kind(self) -> str:
        if self.phase == "wait":
            return "waiting"
        if self.outcome == "retrying":
            return "retrying"
        if self.outcome in _FAILED:
            return "failed"
        return "compensation" if self.phase == "compensation" else "forward"


@dataclass(frozen=True, slots=True)
class SentCommand:
    """One command the saga sent (a message id), however many log entries it has."""

    step: str
    phase: str
    message_id: UUID
    first_sent_at: datetime
    tries: int | None
    outcome: str


def _ms(moment: datetime, origin: datetime) -> float:
    return (moment - origin).total_seconds() * 1000


def _tries(attempt: int, letter: DeadLetterRow | None, after_hold: bool) -> tuple[int, str]:
    """How many times the step's command was tried: the participant's count when its
    command became a dead letter, plus the replays once the saga went on after a hold."""
    if letter is None:
        return attempt, ""
    if after_hold and letter.replay_count:
        return letter.attempts + letter.replay_count, f"after replay {letter.replay_count}"
    return letter.attempts, ""


def _resumed(
    letter: DeadLetterRow | None, held_at: datetime, finished: datetime
) -> tuple[datetime, str]:
    """When a step held at ``held_at`` went on, and what it waited for until then: the
    replay of its dead letter; or, its letter purged, the whole hold was a wait."""
    replayed = letter.last_replayed_at if letter else None
    if replayed is not None and held_at < replayed <= finished:
        return replayed, "held, waiting for an operator's replay"
    if letter is not None:
        return finished, "held, waiting for an operator"
    return held_at, ""


def step_rows(
    entries: Sequence[tuple[Any, ...]],
    letters: Sequence[DeadLetterRow],
    origin: datetime,
    branch_of: dict[str, str],
) -> list[TimelineRow]:
    """The step log's entries (oldest first) with holds cut out as waits of their own,
    each forward attempt of a parallel group's member marked with its group (``branch_of``)."""
    letter_of = {
        letter.message_id: letter
        for letter in sorted(letters, key=lambda found: found.id)
        if letter.message_id is not None
    }
    last_end: dict[UUID, datetime] = {}
    rows: list[TimelineRow] = []
    for step, phase, attempt, outcome, logged_start, finished, error, message_id in entries:
        letter = letter_of.get(message_id) if message_id else None
        previous_end = last_end.get(message_id) if message_id else None
        after_hold = previous_end is not None and logged_start < previous_end
        started = logged_start
        if previous_end is not None and after_hold:
            started, what = _resumed(letter, previous_end, finished)
            if started > previous_end:
                rows.append(_row(step, "wait", None, what, previous_end, started, origin))
        tries, note = _tries(attempt, letter, after_hold)
        row = _row(step, phase, tries, outcome, started, finished, origin, error, message_id, note)
        group = branch_of.get(step) if phase == "forward" else None
        rows.append(replace(row, group=group) if group else row)
        if message_id:
            last_end[message_id] = max(finished, previous_end or finished)
    return rows


def _row(
    step: str,
    phase: str,
    tries: int | None,
    outcome: str,
    started: datetime,
    finished: datetime,
    origin: datetime,
    error: str | None = None,
    message_id: UUID | None = None,
    note: str = "",
) -> TimelineRow:
    return TimelineRow(
        step, phase, tries, outcome, started, finished, _ms(started, origin),
        _ms(finished, origin) - _ms(started, origin), error, message_id, note,
    )  # fmt: skip


def current_wait(
    record: SagaRecord, rows: Sequence[TimelineRow], origin: datetime, now: datetime
) -> TimelineRow | None:
    """The wait an unfinished saga is in now (from its last step's end at the earliest)."""
    if record.status.finished or record.step_started_at is None:
        return None
    since = max([record.step_started_at, *(row.finished_at for row in rows)])
    if record.status.needs_operator:
        what = "waiting for an operator"
    elif record.waiting_for:
        what = f"waiting for {record.waiting_for}"
    elif record.waiting_on and record.waiting_on != [record.step]:
        what = f"waiting for {', '.join(record.waiting_on)}"
    else:
        what = "waiting for its reply"
    return _row(record.step or "", "wait", None, what, since, max(now, since), origin)


def commands_sent(rows: Sequence[TimelineRow]) -> list[SentCommand]:
    """Each command once: its step, when first sent, its tries and last outcome."""
    found: dict[UUID, SentCommand] = {}
    for row in rows:
        if row.message_id is None or row.phase == "wait":
            continue
        first = found.get(row.message_id)
        tries = [t for t in (row.tries, first.tries if first else None) if t is not None]
        found[row.message_id] = SentCommand(
            row.step,
            row.phase,
            row.message_id,
            first.first_sent_at if first else row.started_at,
            max(tries) if tries else None,
            row.outcome,
        )
    return list(found.values())


def _label(i: int, row: TimelineRow) -> str:
    if row.phase == "wait":
        return f"{i}. … {row.step}: {row.outcome} ({_duration(row.duration_ms)})"
    arrow = "↩" if row.phase == "compensation" else "→"
    tries = f"try {row.tries}, " if row.tries is not None else ""
    step = f"{row.group} ┃ {row.step}" if row.group else row.step
    return f"{i}. {arrow} {step} ({tries}{row.outcome})"


def _duration(ms: float) -> str:
    return f"{ms / 1000:,.1f} s" if ms >= 1000 else f"{ms:,.1f} ms"


def chart(rows: Sequence[TimelineRow]) -> dict[str, Any]:
    """Chart.js floating bars, one per row, on an axis of ms since the saga started.
    A long wait is drawn shortened (the axis then has no numbers: each bar's tooltip
    tells its true times)."""
    work = sum(row.duration_ms for row in rows if row.phase != "wait")
    longest = max(_MIN_FOLDED_MS, work * _FOLDED_SHARE)
    folds = [
        (row.offset_ms, row.offset_ms + row.duration_ms, longest)
        for row in rows
        if row.phase == "wait" and row.duration_ms > longest
    ]

    def drawn(ms: float) -> float:
        shift = 0.0
        for start, end, kept in folds:
            cut = (end - start) - kept
            if ms >= end:
                shift += cut
            elif ms > start:
                shift += (ms - start) * cut / (end - start)
        return round(ms - shift, 1)

    bars, tips = [], []
    for row in rows:
        end = row.offset_ms + max(row.duration_ms, 0.5)
        bars.append([drawn(row.offset_ms), max(drawn(end), drawn(row.offset_ms) + 0.5)])
        tips.append(f"at {row.offset_ms:,.1f} ms, took {_duration(row.duration_ms)}")
    return {
        "labels": [_label(i, row) for i, row in enumerate(rows, 1)],
        "bars": bars,
        "tips": tips,
        "colours": [_BAR_COLOURS[row.kind] for row in rows],
        "folded": bool(folds),
    }
