"""What the operator of a chaos run does: replay held charges, resume stranded sagas."""

from __future__ import annotations

import os
import re
import subprocess

from saga.examples.order_saga.cluster import Cluster
from saga.examples.order_saga.processes import SAGA
from saga.messaging.dead_letters import DeadLetterFilter, DeadLetterStore
from saga.operations.replay import replay

#: A volatile Redis run resumes the sagas that made no progress for this long.
STUCK_AFTER_S = 15

_UNFINISHED = """
SELECT count(*), count(*) FILTER (WHERE updated_at >= now() - %s * interval '1 second')
FROM saga.saga_instances WHERE status IN ('running', 'compensating')
"""


class BulkResume:
    """The operator's one ``saga resume --stuck-after`` after a volatile Redis lost messages:
    run once every unfinished saga has made no progress for :data:`STUCK_AFTER_S`."""

    def __init__(self, system: Cluster) -> None:
        self.system = system
        self.runs = 0
        self.resumed = 0

    def once_all_stuck(self) -> None:
        if self.runs:
            return
        with self.system.connect("orders") as conn:
            row = conn.execute(_UNFINISHED, (STUCK_AFTER_S,)).fetchone()
        unfinished, moving = row if row else (0, 0)
        if not unfinished or moving:
            return
        env = {**os.environ, **self.system.env("orders")}
        done = subprocess.run(
            [SAGA, "resume", "--stuck-after", f"{STUCK_AFTER_S}s", "--reason", "redis lost"],
            env=env, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        self.runs += 1
        found = re.search(r"resumed (\d+) saga", done.stdout)
        self.resumed = int(found.group(1)) if found else 0
        print(f"  bulk resume: {done.stdout.strip().splitlines()[-1]}", flush=True)


def replay_held(system: Cluster) -> int:
    """Replay the payments dead letters of held sagas (the gateway is back); how many."""
    with system.connect("orders") as conn:
        held = conn.execute(
            "SELECT count(*) FROM saga.saga_instances WHERE status = 'step_dead_lettered'"
        ).fetchone()
    if not held or not held[0]:
        return 0
    store = DeadLetterStore("saga")
    with system.connect("payments") as conn:
        letters = store.find(conn, DeadLetterFilter(consumer="payments"))
        conn.rollback()
        result = replay(conn, letters, {"command": "chaos operator"})
    return len(result.replayed)
