"""The ceiling for saga steps: pgbench running exactly one step's transaction, nothing else.

A consumed step commits one transaction: its inbox row (deduplication), its business write
and its outbox row (the reply). This runs that transaction as a pgbench script
(``-n -M prepared -T``) against a scratch database migrated with the framework's schema plus
an ``accounts`` table, for several client counts (``-j`` up to the core count), and reports
the highest ``tps = ... (without initial connection time)`` and the client count that gave
it. No Python, no broker: no step can commit faster than this on the same server.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from bench.environment import ScratchDatabase
from bench.workload import ACCOUNTS, create_tables

PGBENCH = "/usr/bin/pgbench"

STEP = f"""\\set id random(1, {ACCOUNTS})
BEGIN;
INSERT INTO saga.inbox (consumer, message_id) VALUES ('bench', gen_random_uuid());
UPDATE accounts SET balance = balance + 1 WHERE id = :id;
INSERT INTO saga.outbox (message_id, destination, message_type, body)
  VALUES (gen_random_uuid(), 'bench', 'Bench', convert_to(repeat('x', 200), 'UTF8'));
END;
"""

_TPS = re.compile(r"^tps = ([\d.]+) \(without initial connection time\)", re.MULTILINE)


def _tps(url: str, script: Path, clients: int, seconds: int) -> float:
    jobs = max(1, min(clients, os.cpu_count() or 1, 2))
    command = [PGBENCH, "-n", "-M", "prepared", "-f", str(script)]
    command += ["-c", str(clients), "-j", str(jobs), "-T", str(seconds), url]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    match = _TPS.search(done.stdout)
    if done.returncode != 0 or not match:
        raise RuntimeError(f"pgbench -c {clients} failed: {done.stderr.strip() or done.stdout}")
    return float(match.group(1))


def step_tps(
    clients: tuple[int, ...] = (1, 2, 4, 8, 16, 32), seconds: int = 4
) -> tuple[float, int, dict[int, float]]:
    """Best step transactions per second, its client count, and every count's figure."""
    if not Path(PGBENCH).exists():
        raise RuntimeError(f"{PGBENCH} not found (Debian package postgresql-client)")
    db = ScratchDatabase.create("saga_bench_ceiling")
    try:
        create_tables(db.url)
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "step.sql"
            script.write_text(STEP)
            sweep = {n: _tps(db.url, script, n, seconds) for n in clients}
    finally:
        db.drop()
    best = max(sweep, key=sweep.__getitem__)
    return sweep[best], best, sweep
