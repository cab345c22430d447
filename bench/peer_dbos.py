"""Peer: DBOS Transact workflows of three transactional steps, each step one step's writes.

DBOS checkpoints workflows in PostgreSQL instead of passing messages. DBOS 3.4 has no
``@DBOS.transaction()``; a transactional step is ``@datasource.transaction()`` on a
``SQLAlchemyDatasource`` over the application database, which records the step's output in
the same transaction. Each step updates a random ``accounts`` row and inserts a ``step_log``
row, at READ COMMITTED like the other measurements (DBOS's default is SERIALIZABLE).

DBOS keeps global state, so it runs in subprocesses: ``processes`` of them (each its own
executor) share a system database and the application database, two scratch databases on the
local server. Each launches DBOS, runs one warm-up workflow and reports ready; on a common go
signal each calls its share of ``count`` workflows from a pool of ``threads`` threads. The
figure is workflows per second from the go signal to the last return in any process; the
parent checks that ``count`` third steps were committed, and drops both databases.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import IO

from bench.environment import ScratchDatabase
from bench.workload import create_tables, finished

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ((1, 4), (1, 8), (2, 4))  # (processes, threads per process)


def _child(system_url: str, app_url: str, runs: range, threads: int) -> None:
    """In a subprocess: launch DBOS, print ``ready``, wait for a line on stdin, run workflows
    ``runs`` from ``threads`` callers, print the wall-clock time when the last one returned."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    import sqlalchemy as sa
    from dbos import DBOS, DBOSConfig, SQLAlchemyDatasource

    from bench.workload import ACCOUNTS

    update = sa.text("UPDATE accounts SET balance = balance + 1 WHERE id = :id")
    log = sa.text("INSERT INTO step_log (run, step) VALUES (:run, :step)")
    config: DBOSConfig = {
        "name": "saga_bench",
        "system_database_url": system_url,
        "sys_db_pool_size": max(20, threads + 4),
        "max_executor_threads": threads,
        "log_level": "WARNING",
        "executor_id": f"bench-{runs.start}",
    }
    DBOS(config=config)
    ds = SQLAlchemyDatasource.create(app_url, engine_kwargs={"pool_size": threads})

    @ds.transaction(isolation_level="READ COMMITTED")
    def step(run: int, number: int) -> None:
        session = ds.sql_session()
        session.execute(update, {"id": random.randint(1, ACCOUNTS)})
        session.execute(log, {"run": run, "step": number})

    @DBOS.workflow()
    def three_steps(run: int) -> None:
        for number in (1, 2, 3):
            step(run, number)

    DBOS.launch()
    try:
        three_steps(-1 - runs.start)  # warm-up, not counted
        print("ready", flush=True)
        sys.stdin.readline()
        with ThreadPoolExecutor(threads) as callers:
            list(callers.map(three_steps, runs))
        print(json.dumps({"finished_at": time.time()}), flush=True)
    finally:
        DBOS.destroy()


def _start(system: str, app: str, runs: range, threads: int, log: IO[str]) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "bench.peer_dbos", system, app]
    command += [str(runs.start), str(runs.stop), str(threads)]
    pipe = subprocess.PIPE
    child = subprocess.Popen(command, cwd=ROOT, stdin=pipe, stdout=pipe, stderr=log, text=True)
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        child.kill()
        raise RuntimeError(f"DBOS did not start (exit code {child.wait()}): {_tail(log)}")
    return child


def _tail(log: IO[str]) -> str:
    log.seek(0)
    return log.read()[-2000:]


def _measure(
    system: str, app: str, count: int, threads: int, processes: int, log: IO[str]
) -> float:
    """Seconds from the go signal to the last workflow's return, over all processes."""
    children: list[subprocess.Popen[str]] = []
    try:
        # Started one at a time, so that only the first creates DBOS's tables.
        for i in range(processes):
            runs = range(i * count // processes, (i + 1) * count // processes)
            children.append(_start(system, app, runs, threads, log))
        started = time.time()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        ends: list[float] = []
        for child in children:
            out, _ = child.communicate(timeout=300)
            if child.returncode != 0:
                raise RuntimeError(f"DBOS exited with code {child.returncode}: {_tail(log)}")
            ends.append(float(json.loads(out.strip().splitlines()[-1])["finished_at"]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    return max(ends) - started


def workflows_per_s(count: int = 1_000, threads: int = 4, processes: int = 1) -> float:
    """Three-step DBOS workflows completed per second: ``processes`` DBOS processes sharing one
    system database, each calling workflows from ``threads`` threads."""
    try:
        metadata.version("dbos")
    except metadata.PackageNotFoundError as exc:
        raise RuntimeError("dbos is not installed (pip install -e '.[bench]')") from exc
    system = ScratchDatabase.create("saga_bench_dbos_sys", framework=False)
    app = ScratchDatabase.create("saga_bench_dbos_app", framework=False)
    try:
        create_tables(app.url)
        with tempfile.TemporaryFile("w+") as log:
            elapsed = _measure(system.url, app.url, count, threads, processes, log)
        committed = finished(app.url, 3) - processes  # less one warm-up workflow each
        if committed != count:
            raise RuntimeError(f"DBOS committed {committed} of {count} third steps")
    finally:
        app.drop()
        system.drop()
    return count / elapsed


def best(count: int = 1_000) -> tuple[float, tuple[int, int], dict[str, float]]:
    """Try each of ``SETTINGS``; the best rate, its (processes, threads), every figure."""
    sweep = {f"{p} x {t}": workflows_per_s(count, t, p) for p, t in SETTINGS}
    name = max(sweep, key=sweep.__getitem__)
    processes, threads = (int(n) for n in name.split(" x "))
    return sweep[name], (processes, threads), sweep


if __name__ == "__main__":
    first, stop, threads = (int(n) for n in sys.argv[3:6])
    _child(sys.argv[1], sys.argv[2], range(first, stop), threads)
