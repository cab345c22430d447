"""The Celery app that ``bench.peer_celery`` starts a worker for: one task, one step's writes.

Configured from the environment so the worker subprocess and the submitting process agree:
``SAGA_BENCH_CELERY_BROKER``, ``SAGA_BENCH_CELERY_QUEUE`` and ``SAGA_BENCH_CELERY_DATABASE``.
"""

from __future__ import annotations

import os
import random
import threading

import psycopg
from celery import Celery

from bench.workload import ACCOUNTS, LOG, UPDATE

app = Celery("saga_bench")
app.conf.update(
    broker_url=os.environ.get("SAGA_BENCH_CELERY_BROKER", "amqp://guest:guest@127.0.0.1:5672//"),
    task_default_queue=os.environ.get("SAGA_BENCH_CELERY_QUEUE", "saga_bench_celery"),
    task_ignore_result=True,
    worker_enable_remote_control=False,
    broker_connection_retry_on_startup=True,
)

_local = threading.local()


def _connection() -> psycopg.Connection:
    """One connection per worker process (prefork) or thread (threads pool), opened lazily."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["SAGA_BENCH_CELERY_DATABASE"], autocommit=True)
        _local.conn = conn
    return conn


@app.task(name="saga_bench.step")
def step(run: int, number: int) -> None:
    """One transaction: update a random business row and log the step."""
    conn = _connection()
    with conn.transaction():
        conn.execute(UPDATE, (random.randint(1, ACCOUNTS),))
        conn.execute(LOG, (run, number))
