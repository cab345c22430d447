"""The framework on the peers' workload: sagas of three remote steps doing the same writes.

Two scratch databases, the saga's home (``runs``) and the ``steps`` service's (with the
peers' ``accounts`` and ``step_log`` tables), each with a consumer and a relay, all ``saga``
subprocesses on the same RabbitMQ (see ``bench._saga_app``); the saga's home runs one or
two orchestrator processes (one thread each: threads only add GIL contention). After a
warm-up, ``count`` sagas are started from this process, 50 per transaction, as fast as it
can; the figure is sagas per second from the first start until no saga is unfinished.
Every saga's third step must be in ``step_log``.

``broker="postgres"`` runs the same processes on the framework's PostgreSQL transport
instead, its messages in a scratch database of their own on the same server (the
``pg_broker_vs_rabbitmq`` figure of ``make bench``).
"""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path

import psycopg

from bench._saga_app import Run, three_steps
from bench.environment import AMQP_URL, ScratchDatabase
from bench.saga_e2e import wait_until_finished
from bench.workload import ACCOUNTS, create_tables, finished
from saga.examples.order_saga.cluster import delete_queues
from saga.examples.order_saga.processes import saga_env
from tests.rig.supervisor import Supervisor

APP = "bench._saga_app"
WARM_UP = 200
PER_TRANSACTION = 50


class ThreeStepBench:
    """The two services and their relays, running on scratch databases until closed."""

    def __init__(
        self,
        work_dir: Path,
        concurrency: int = 1,
        orchestrators: int = 1,
        *,
        log_statements: bool = False,
        broker: str = "rabbitmq",
    ) -> None:
        run_id = uuid.uuid4().hex[:6]
        self.prefix = f"bench{run_id}."
        self.home = ScratchDatabase.create(f"bench_{run_id}_runs", log_statements=log_statements)
        self.steps = ScratchDatabase.create(f"bench_{run_id}_steps", log_statements=log_statements)
        #: The PostgreSQL broker's own database (None on RabbitMQ).
        self.broker_db = (
            ScratchDatabase.create(f"bench_{run_id}_broker", framework=False)
            if broker == "postgres"
            else None
        )
        broker_url = self.broker_db.url if self.broker_db is not None else AMQP_URL
        create_tables(self.steps.url)
        commands = []
        for name, database, target, processes in (
            ("runs", self.home, "registry", orchestrators),
            ("steps", self.steps, "service", 1),
        ):
            env = saga_env(database.url, broker_url, self.prefix)
            commands.append((f"{name}-relay", ["relay"], env))
            consume = ["consume", f"{APP}:{target}", "--concurrency", str(concurrency)]
            commands += [(f"{name}-{i + 1}", consume, env) for i in range(processes)]
        self.supervisor = Supervisor(commands, work_dir)
        self.started = 0

    def measure(self, count: int) -> float:
        """Start ``count`` sagas, wait for all of them; sagas per second."""
        began = time.monotonic()
        rng = random.Random(self.started)
        runs = range(self.started, self.started + count)
        with psycopg.connect(self.home.url) as conn:
            for first in range(runs.start, runs.stop, PER_TRANSACTION):
                with conn.transaction():
                    for run in range(first, min(first + PER_TRANSACTION, runs.stop)):
                        accounts = [rng.randint(1, ACCOUNTS) for _ in range(3)]
                        three_steps.start(conn, Run(run=run, accounts=accounts))
        self.started += count
        wait_until_finished(self.home.url, timeout=600)
        elapsed = time.monotonic() - began
        done = finished(self.steps.url, 3)
        if done != self.started:
            raise RuntimeError(f"{done} sagas reached their third step, not {self.started}")
        return count / elapsed

    def close(self) -> None:
        self.supervisor.stop()
        self.home.drop()
        self.steps.drop()
        if self.broker_db is not None:
            self.broker_db.drop()
        else:
            delete_queues(AMQP_URL, self.prefix, ("runs", "steps"))


def sagas_per_s(
    count: int,
    work_dir: Path,
    orchestrators: tuple[int, ...] = (1, 2),
    broker: str = "rabbitmq",
) -> tuple[float, int, dict[int, float]]:
    """Best sagas per second at full load, the orchestrator process count that gave it,
    and every count's figure (like the peers, the framework gets its best setting), on
    ``broker``: ``rabbitmq`` or ``postgres``."""
    sweep = {}
    for processes in orchestrators:
        bench = ThreeStepBench(
            work_dir / f"{broker}-{processes}", orchestrators=processes, broker=broker
        )
        try:
            bench.measure(WARM_UP)
            sweep[processes] = bench.measure(count)
        finally:
            bench.close()
    best = max(sweep, key=sweep.__getitem__)
    return sweep[best], best, sweep
