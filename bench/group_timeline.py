"""``python -m bench.group_timeline``: where the parallel group's time goes, hop by hop.

Runs the system of ``make bench`` idle: sagas of the order saga's version 2 (stock and
credit reserved at once, a parallel group) and version 1 (one after the other), taking
turns, one a second in all by default. Then it reads, for every saga, when each
reservation's transactions began and committed, from PostgreSQL's own clocks:

- a transaction's start is ``now()`` of the inbox row it wrote (``received_at``): the
  service's for the command, the home's for the reply;
- its commit is the commit timestamp of that row's ``xmin`` (or of the step log's row
  the home wrote for the reply), which needs ``track_commit_timestamp = on`` (a server
  setting: ``ALTER SYSTEM SET track_commit_timestamp = on``, then a restart);
- the command's transaction is the home's first to commit at or after the step's start
  (the step log's ``started_at``, the engine's clock in the transition that sent it).

Each step (or the group, from its members' latest milestones) splits into five segments
that add up to it: the rest of the sending transaction after the transition, the hop to
the service, the service's transaction, the hop back to the home, the home's
transaction. The table puts version 1's stock and credit steps beside version 2's group:
the group saves the credit step, less whatever it costs over the stock step, segment by
segment. Results go to ``bench/results/group-timeline-latest.md``.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from bench import report, saga_e2e
from bench.environment import ADMIN_URL, machine
from bench.run import GroupCost
from saga.examples.order_saga.orders import create_order_v1, create_order_v2

#: The reservations: version 1 makes them one after the other, version 2 at once.
STOCK, CREDIT = "reserve_stock", "reserve_credit"

SEGMENTS = (
    "the sending transaction, after its transition",
    "the hop to the service",
    "the service's transaction",
    "the hop back to the home",
    "the home's transaction",
)

_STEPS = """
SELECT i.saga_version, i.id, s.step, s.message_id,
       extract(epoch FROM s.started_at)::float8,
       extract(epoch FROM pg_xact_commit_timestamp(s.xmin))::float8,
       (SELECT extract(epoch FROM min(b.received_at))::float8
        FROM saga.inbox b WHERE b.xmin = s.xmin)
FROM saga.saga_steps s JOIN saga.saga_instances i ON i.id = s.saga_id
WHERE (i.data->>'order_id' LIKE %s || '-%%' OR i.data->>'order_id' LIKE %s || '-%%')
  AND s.phase = 'forward'
"""

_RECEIVED = """
SELECT message_id, extract(epoch FROM received_at)::float8,
       extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8
FROM saga.inbox WHERE message_id = ANY(%s)
"""


@dataclass(frozen=True, slots=True)
class Milestones:
    """One remote step of one saga (or a group, its members' latest), epoch seconds."""

    started: float  # the transition that sent the command
    sent: float  # the sending transaction's commit
    service_began: float
    service_committed: float
    home_began: float  # the home's transaction that took the (last) reply
    home_committed: float

    @classmethod
    def of_group(cls, members: Sequence[Milestones]) -> Milestones:
        """The group of ``members``: from the first one's start, each milestone reached
        once every member has reached it."""
        return cls(
            min(m.started for m in members),
            max(m.sent for m in members),
            max(m.service_began for m in members),
            max(m.service_committed for m in members),
            max(m.home_began for m in members),
            max(m.home_committed for m in members),
        )

    def segments_ms(self) -> tuple[float, ...]:
        """The five segments (:data:`SEGMENTS`), in milliseconds; they add up to the step."""
        points = (
            self.started,
            self.sent,
            self.service_began,
            self.service_committed,
            self.home_began,
            self.home_committed,
        )
        return tuple((b - a) * 1000 for a, b in itertools.pairwise(points))


@dataclass
class Timeline:
    """Per-segment medians of v1's stock and credit steps and v2's group, ms."""

    stock: list[float]
    credit: list[float]
    group: list[float]
    v1_ms_p50: float
    v2_ms_p50: float

    @property
    def ratio(self) -> float:
        """v2's p50 over v1's, the whole saga."""
        return self.v2_ms_p50 / self.v1_ms_p50

    def rows(self) -> list[tuple[str, str, str]]:
        rows = []
        for i, name in enumerate([*SEGMENTS, "the step, in all"]):
            stock, credit, group = self.stock[i], self.credit[i], self.group[i]
            rows.append(
                (
                    name,
                    f"v2's group {group:.2f} ms: {group - stock:+.2f} over v1's stock step",
                    f"v1's stock step {stock:.2f} ms, credit step {credit:.2f} ms",
                )
            )
        # without its credit step v1 keeps the transaction that sent it (it sends the charge)
        credit_saved = self.credit[-1] - self.credit[0]
        cost = GroupCost(self.group[-1], self.stock[-1], credit_saved, self.v1_ms_p50)
        rows.append(
            (
                "the whole saga, p50",
                f"v2 {self.v2_ms_p50:.1f} ms, v1 {self.v1_ms_p50:.1f} ms: "
                f"a ratio of {self.ratio:.3f}",
                f"{cost.floor:.3f} were the group to cost no more than the stock step",
            )
        )
        return rows


def medians(steps: Iterable[Milestones]) -> list[float]:
    """The median of each segment and of the whole step, over ``steps``, in ms."""
    per_step = [(*m.segments_ms(), (m.home_committed - m.started) * 1000) for m in steps]
    return [statistics.median(column) for column in zip(*per_step, strict=True)]


def read(bench: saga_e2e.Bench, v2: saga_e2e.EndToEnd, v1: saga_e2e.EndToEnd) -> Timeline:
    """The milestones of the reservations of both runs' sagas, from the databases."""
    with bench.system.connect("orders") as conn:
        rows = conn.execute(_STEPS, (v2.batch, v1.batch)).fetchall()
    received: dict[UUID, tuple[float, float]] = {}
    command_ids = [row[3] for row in rows if row[2] in (STOCK, CREDIT)]
    for service in bench.databases:
        with bench.system.connect(service) as conn:
            for message_id, began, committed in conn.execute(_RECEIVED, (command_ids,)):
                received[message_id] = (began, committed)
    commits: dict[UUID, list[float]] = defaultdict(list)
    for _, saga_id, _, _, _, committed, _ in rows:
        commits[saga_id].append(committed)
    sequential: dict[str, list[Milestones]] = defaultdict(list)
    by_saga: dict[UUID, list[Milestones]] = defaultdict(list)
    for version, saga_id, step, message_id, started, committed, home_began in rows:
        if step not in (STOCK, CREDIT):
            continue
        sent = min(c for c in commits[saga_id] if c >= started)
        milestone = Milestones(started, sent, *received[message_id], home_began, committed)
        if version == 1:
            sequential[step].append(milestone)
        else:
            by_saga[saga_id].append(milestone)
    group = [Milestones.of_group(members) for members in by_saga.values()]
    return Timeline(
        medians(sequential[STOCK]),
        medians(sequential[CREDIT]),
        medians(group),
        v1.duration_ms["p50"],
        v2.duration_ms["p50"],
    )


def check_commit_timestamps() -> None:
    with psycopg.connect(ADMIN_URL) as conn:
        row = conn.execute("SHOW track_commit_timestamp").fetchone()
    if not row or row[0] != "on":
        raise SystemExit(
            "track_commit_timestamp is off: this needs PostgreSQL's commit timestamps. "
            "ALTER SYSTEM SET track_commit_timestamp = on and restart the server "
            "(ALTER SYSTEM RESET track_commit_timestamp and restart again afterwards)."
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sagas", type=int, default=60, help="sagas of each version")
    parser.add_argument("--rate", type=float, default=1.0, help="sagas a second, in all")
    args = parser.parse_args()
    check_commit_timestamps()
    with tempfile.TemporaryDirectory() as logs:
        bench = saga_e2e.Bench(Path(logs))
        try:
            for saga in (create_order_v2, create_order_v1):  # warm up
                bench.measure(60, rate=20, saga=saga)
            v2, v1 = saga_e2e.end_to_end_alternating(
                bench, args.rate, args.sagas, create_order_v2, create_order_v1
            )
            timeline = read(bench, v2, v1)
        finally:
            bench.close()
    figures: dict[str, Any] = {
        "group_ms_p50": round(timeline.group[-1], 2),
        "stock_step_ms_p50": round(timeline.stock[-1], 2),
        "credit_step_ms_p50": round(timeline.credit[-1], 2),
        "parallel_e2e_ratio": round(timeline.ratio, 3),
        "sagas_of_each_version": args.sagas,
        "sagas_per_s": args.rate,
    }
    path = report.write(figures, timeline.rows(), machine(), name="group-timeline")
    print(path.read_text())


if __name__ == "__main__":
    main()
