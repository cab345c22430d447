"""The framework on the peers' workload: sagas of three remote steps doing the same writes.

Two scratch databases, the saga's home (``runs``) and the ``steps`` service's (with the
peers' ``accounts`` and ``step_log`` tables), each with a consumer and a relay, all ``saga``
subprocesses on the same RabbitMQ (see ``bench._saga_app``). After a warm-up, ``count``
sagas are started from this process, 50 per transaction, as fast as it can; the figure is
sagas per second from the first start until no saga is unfinished. Every saga's third step
must be in ``step_log``.
"""

from __future__ import annotations

import random
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from kombu import Connection

from bench._saga_app import Run, three_steps
from bench.environment import AMQP_URL, ScratchDatabase
from bench.saga_e2e import wait_until_finished
from bench.workload import ACCOUNTS, create_tables, finished
from examples.order_saga.processes import saga_env
from examples.order_saga.supervisor import Supervisor
from saga.transport import Topology

APP = "bench._saga_app"
WARM_UP = 200
PER_TRANSACTION = 50


def sagas_per_s(count: int) -> float:
    """Sagas per second at full load, each three steps of the peers' writes."""
    run_id = uuid.uuid4().hex[:6]
    prefix = f"bench{run_id}."
    home = ScratchDatabase.create(f"bench_{run_id}_runs")
    steps = ScratchDatabase.create(f"bench_{run_id}_steps")
    try:
        create_tables(steps.url)
        commands = []
        for name, database, target in (("runs", home, "registry"), ("steps", steps, "service")):
            env = saga_env(database.url, AMQP_URL, prefix)
            commands.append((f"{name}-relay", ["relay"], env))
            commands.append((name, ["consume", f"{APP}:{target}"], env))
        with tempfile.TemporaryDirectory() as logs:
            supervisor = Supervisor(commands, Path(logs))
            try:
                _start(home.url, range(WARM_UP))
                wait_until_finished(home.url, timeout=120)
                started = time.monotonic()
                _start(home.url, range(WARM_UP, WARM_UP + count))
                wait_until_finished(home.url, timeout=600)
                elapsed = time.monotonic() - started
            finally:
                supervisor.stop()
        done = finished(steps.url, 3)
        if done != WARM_UP + count:
            raise RuntimeError(f"{done} sagas reached their third step, not {WARM_UP + count}")
        return count / elapsed
    finally:
        home.drop()
        steps.drop()
        with Connection(AMQP_URL) as conn:
            channel = conn.channel()
            for queue in ("runs", "steps"):
                Topology(queue_prefix=prefix).queue(queue)(channel).delete()


def _start(database_url: str, runs: range) -> None:
    rng = random.Random(runs.start)
    with psycopg.connect(database_url) as conn:
        for first in range(runs.start, runs.stop, PER_TRANSACTION):
            with conn.transaction():
                for run in range(first, min(first + PER_TRANSACTION, runs.stop)):
                    accounts = [rng.randint(1, ACCOUNTS) for _ in range(3)]
                    three_steps.start(conn, Run(run=run, accounts=accounts))
