"""The Celery app that ``bench.peer_celery`` starts a worker for: one task, one step's writes.

The worker (``celery -A bench._celery_app``) is configured from the environment:
``SAGA_BENCH_CELERY_BROKER``, ``SAGA_BENCH_CELERY_QUEUE`` and ``SAGA_BENCH_CELERY_DATABASE``;
the submitting process builds its own app for the same queue with ``make_app``.
"""

from __future__ import annotations

import os
import random
import threading

import psycopg
from celery import Celery

from bench.workload import ACCOUNTS, LOG, UPDATE

TASK = "saga_bench.step"


def make_app(broker: str, queue: str) -> Celery:
    """A Celery app sending to and consuming from ``queue`` only, without a result backend."""
    app = Celery("saga_bench")
    app.conf.update(
        broker_url=broker,
        task_default_queue=queue,
        task_ignore_result=True,
        worker_enable_remote_control=False,
        broker_connection_retry_on_startup=True,
    )
    return app


app = make_app(
    os.environ.get("SAGA_BENCH_CELERY_BROKER", "amqp://guest:guest@127.0.0.1:5672//"),
    os.environ.get("SAGA_BENCH_CELERY_QUEUE", "saga_bench_celery"),
)

_local = threading.local()


def _connection() -> psycopg.Connection:
    """One connection per worker process (prefork) or thread (threads pool), opened lazily."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["SAGA_BENCH_CELERY_DATABASE"], autocommit=True)
        _local.conn = conn
    return conn


@app.task(name=TASK)
def step(run: int, number: int) -> None:
    """One transaction: update a random business row and log the step."""
    conn = _connection()
    with conn.transaction():
        conn.execute(UPDATE, (random.randint(1, ACCOUNTS),))
        conn.execute(LOG, (run, number))
