"""Where an unfinished saga of a chaos run stands: the message it waits on and every
trace of it in the services' databases, so a run that does not converge says why."""

from __future__ import annotations

import re
from pathlib import Path

from saga.broker.transport import Topology
from saga.engine.state import waiting_on
from saga.examples.order_saga.cluster import SAGA_SERVICES, Cluster

#: The line a home service's consumer logs when it resumed stuck sagas by itself.
_RESUMED = re.compile(r"resumed \d+ stuck saga\(s\) of orders \(no progress for [^)]*\): (.*)")
_SAGA_AT_STEP = re.compile(r"[0-9a-f-]{36} at \w+")


def automatic_resumes(log_dir: Path) -> list[str]:
    """``<saga id> at <step>`` for each saga the orders consumers resumed by themselves
    (``SAGA_RESUME_STUCK_AFTER``), from their logs (of every run of every process)."""
    resumed: list[str] = []
    for log in sorted(log_dir.glob("orders*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if found := _RESUMED.search(line):
                resumed.extend(_SAGA_AT_STEP.findall(found.group(1)))
    return resumed


def describe_stuck(system: Cluster, limit: int = 5) -> list[str]:
    """One line per saga still running or compensating (the oldest ``limit``): its step,
    the messages it awaits (and the steps that sent them), and where they and its saga's
    rows are: which services' inboxes recorded one, their outbox rows and dead letters; then the
    messages ready in each service's queue (with the consumers stopped, the unacknowledged
    ones are back in it)."""
    with system.connect("orders") as conn:
        stuck = conn.execute(
            "SELECT id, status, step, step_state, pending_message_id, updated_at "
            "FROM saga.saga_instances "
            "WHERE status IN ('running', 'compensating') ORDER BY updated_at LIMIT %s",
            (limit,),
        ).fetchall()
    lines = []
    for saga_id, status, step, step_state, pending, updated_at in stuck:
        awaited = step_state.get("awaits") or [pending]  # a parallel group awaits several
        handled, outbox, letters = [], {}, {}
        for service in SAGA_SERVICES:
            with system.connect(service) as conn:
                row = conn.execute(
                    "SELECT (SELECT count(*) FROM saga.inbox WHERE message_id = ANY(%b::uuid[])), "
                    "(SELECT count(*) FROM saga.outbox WHERE saga_id = %s), "
                    "(SELECT count(*) FROM saga.dead_letters WHERE saga_id = %s)",
                    ([str(m) for m in awaited], saga_id, saga_id),
                ).fetchone()
            assert row is not None
            if row[0]:
                handled.append(service)
            if row[1]:
                outbox[service] = row[1]
            if row[2]:
                letters[service] = row[2]
        lines.append(
            f"unconverged saga {saga_id}: {status} at {step} since {updated_at:%H:%M:%S}, "
            f"awaiting {', '.join(map(str, awaited))} "
            f"({', '.join(waiting_on(step, step_state))}); handled by {handled or 'no inbox'}; "
            f"outbox rows {outbox or 'none'}; dead letters {letters or 'none'}"
        )
    if stuck:
        topology = Topology(queue_prefix=system.queue_prefix)
        depths = system.broker.queue_depths(topology, system.services)
        waiting = {queue: depth.ready for queue, depth in depths.items()}
        lines.append(f"messages ready in the queues: {waiting}")
    return lines
