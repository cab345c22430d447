"""Peer: Celery 5 chains of three tasks, each task one step's writes, over the same RabbitMQ.

What users would pick instead of the framework, with no outbox and no deduplication: each task
commits one transaction on a scratch PostgreSQL database (update a random ``accounts`` row,
insert a ``step_log`` row) and Celery sends the next task of the chain itself. A worker is
started as a subprocess (``celery worker`` with the given pool and concurrency, a unique
queue, no result backend, default acknowledgement and prefetch settings); after a warm-up,
``count`` chains are submitted from this process. The figure is chains per second from the
first submit to the commit of the last third task (``max(done_at)`` of the step-3 rows,
polled until all are there). The worker gets SIGTERM (warm shutdown) afterwards; the
database, queue and exchange are removed.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from subprocess import Popen, TimeoutExpired
from typing import Any

import psycopg

from bench.environment import AMQP_URL, ScratchDatabase
from bench.workload import create_tables

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = (("prefork", 2), ("threads", 8), ("threads", 16))  # (pool, concurrency)


def _app(queue: str) -> tuple[Any, Any, str]:
    """A Celery app submitting to ``queue``, Celery's ``chain`` and the task's name."""
    try:
        from celery import chain

        from bench._celery_app import TASK, make_app
    except ImportError as exc:
        raise RuntimeError(f"celery is not usable ({exc}); pip install -e '.[bench]'") from exc
    return make_app(AMQP_URL, queue), chain, TASK


def _start_worker(pool: str, concurrency: int, queue: str, db: str, log: Path) -> Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SAGA_BENCH_CELERY_BROKER": AMQP_URL}
    env |= {"SAGA_BENCH_CELERY_QUEUE": queue, "SAGA_BENCH_CELERY_DATABASE": db}
    command = [sys.executable, "-m", "celery", "-A", "bench._celery_app", "worker", "-Q", queue]
    command += ["--pool", pool, "--concurrency", str(concurrency), "--loglevel", "WARNING"]
    command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    with log.open("wb") as out:
        return Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True)


def _stop_worker(worker: Popen[bytes]) -> None:
    """Warm shutdown (SIGTERM); the worker's process group is killed if it takes over 30 s."""
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def _wait(url: str, runs: int, since: int, deadline: float, log: Path) -> float:
    """Poll until ``runs`` runs numbered ``>= since`` finished step 3; their last commit time."""
    query = "SELECT count(*), extract(epoch FROM max(done_at)) FROM step_log"
    query += " WHERE step = 3 AND run >= %s"
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(query, (since,)).fetchone()
            assert row is not None
            if row[0] >= runs:
                return float(row[1])
            if time.monotonic() > deadline:
                tail = log.read_text()[-2000:]
                raise RuntimeError(f"celery finished {row[0]} of {runs} chains; worker:\n{tail}")
            time.sleep(0.02)


def chains_per_s(count: int = 2_000, pool: str = "prefork", concurrency: int = 2) -> float:
    """Three-task chains completed per second by one Celery worker (``pool``, ``concurrency``)."""
    queue = f"saga_bench_celery_{uuid.uuid4().hex[:8]}"
    app, chain, task = _app(queue)

    def submit(run: int) -> None:
        chain(*(app.signature(task, (run, n), immutable=True) for n in (1, 2, 3))).apply_async()

    db = ScratchDatabase.create("saga_bench_celery", framework=False)
    worker: Popen[bytes] | None = None
    try:
        create_tables(db.url)
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "worker.log"
            worker = _start_worker(pool, concurrency, queue, db.url, log)
            warm = 2 * concurrency  # negative run numbers, not counted
            for run in range(-warm, 0):
                submit(run)
            _wait(db.url, warm, -warm, time.monotonic() + 60, log)
            started = time.time()
            for run in range(count):
                submit(run)
            last = _wait(db.url, count, 0, time.monotonic() + 300, log)
    finally:
        if worker is not None:
            _stop_worker(worker)
        app.close()
        db.drop()
        _delete_queue(queue)
    return count / (last - started)


def _delete_queue(name: str) -> None:
    from kombu import Connection, Exchange, Queue

    with Connection(AMQP_URL) as conn:
        channel = conn.channel()
        Queue(name, Exchange(name))(channel).delete()
        Exchange(name)(channel).delete()


def best(count: int = 2_000) -> tuple[float, str, int, dict[str, float]]:
    """Try each of ``SETTINGS``; the best rate, its pool and concurrency, and every figure."""
    sweep = {f"{p} x{c}": chains_per_s(count, p, c) for p, c in SETTINGS}
    name = max(sweep, key=sweep.__getitem__)
    pool, concurrency = name.split(" x")
    return sweep[name], pool, int(concurrency), sweep
