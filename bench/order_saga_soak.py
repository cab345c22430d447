"""The order saga at a steady rate while a snapshot is held on every database, on the
PostgreSQL broker and on RabbitMQ side by side.

``python -m bench.order_saga_soak [--broker postgres rabbitmq] [--rate 20] [--long]``

The saga's four services, their relays and the payment gateway run as processes (as in
``bench.saga_e2e``), each service on a scratch database of its own, the PostgreSQL broker
on one more. A driver starts orders at ``--rate`` a second. After ``--before`` seconds
another session on every database (the broker's too) opens a ``REPEATABLE READ``
transaction, reads, and stays idle for ``--hold`` seconds, as a report or a forgotten psql
window does; vacuum reclaims nothing meanwhile. Every ``--window`` seconds a sample says
whether the snapshots were held, the sagas finished per second in the window, and (on the
PostgreSQL broker) the messages table's size with its indexes. The summary divides each
held window's rate by the mean rate before the hold, gives the largest broker table of the
hold, and the seconds from the release to the first window back at 0.95 of the rate.

The default is short (1 min before, 2 min held, 1 min after, windows of 30 s: what ``make
bench`` runs); ``--long`` holds for 10 minutes in windows of 60 s. Results go to
``bench/results/order-saga-held-snapshot-<date>.json`` (and ``-latest.json``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from bench.environment import AMQP_URL, ScratchDatabase
from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import SAGA_SERVICES, TARGETS, Cluster
from tests.rig.supervisor import Supervisor

RESULTS = Path(__file__).resolve().parent / "results"
BROKERS = ("postgres", "rabbitmq")

_FINISHED = "SELECT count(*) FROM saga.saga_instances WHERE status IN ('completed', 'compensated')"
_BROKER_BYTES = (
    "SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0)::bigint FROM pg_inherits "
    "WHERE inhparent = to_regclass('saga_broker.messages')"
)


@dataclass(frozen=True)
class Plan:
    """Seconds before, during and after the hold, the sampling window, orders a second."""

    before: float = 60
    hold: float = 120
    after: float = 60
    window: float = 30
    rate: float = 20

    @classmethod
    def long(cls, rate: float) -> Plan:
        return cls(before=120, hold=600, after=120, window=60, rate=rate)


class System:
    """The order saga's processes on scratch databases, on one broker."""

    def __init__(self, broker: str, work_dir: Path) -> None:
        run_id = uuid.uuid4().hex[:6]
        self.databases = [
            ScratchDatabase.create(f"bench_{run_id}_{s}", framework=False) for s in SAGA_SERVICES
        ]
        self.broker_database = (
            ScratchDatabase.create(f"bench_{run_id}_broker", framework=False)
            if broker == "postgres"
            else None
        )
        broker_url = self.broker_database.url if self.broker_database else AMQP_URL
        self.cluster = Cluster(
            {s: d.url for s, d in zip(SAGA_SERVICES, self.databases, strict=True)},
            broker_url,
            queue_prefix=f"soak{run_id}.",
        )
        self.cluster.prepare()
        commands = [self.cluster.gateway_command()]
        for service in SAGA_SERVICES:
            commands.append((f"{service}-relay", ["relay"], self.cluster.env(service)))
            commands.append((service, ["consume", TARGETS[service]], self.cluster.env(service)))
        self.supervisor = Supervisor(commands, work_dir)

    @property
    def urls(self) -> list[str]:
        """Every database of the run: the services' and the broker's."""
        extra = [self.broker_database] if self.broker_database else []
        return [d.url for d in [*self.databases, *extra]]

    def finished(self) -> int:
        with self.cluster.connect("orders") as conn:
            row = conn.execute(_FINISHED).fetchone()
        return int(row[0]) if row else 0

    def broker_bytes(self) -> int | None:
        """The PostgreSQL broker's messages table with its indexes (None on RabbitMQ)."""
        if self.broker_database is None:
            return None
        with psycopg.connect(self.broker_database.url) as conn:
            row = conn.execute(_BROKER_BYTES).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.supervisor.stop()
        self.cluster.delete_queues()
        for database in self.databases:
            database.drop()
        if self.broker_database:
            self.broker_database.drop()


def _hold_snapshots(stack: ExitStack, urls: list[str]) -> None:
    """A session on each database that keeps a snapshot until ``stack`` closes."""
    for url in urls:
        holder = stack.enter_context(psycopg.connect(url, application_name="soak-held-snapshot"))
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")


def _first_saga(system: System, timeout: float = 180) -> None:
    """One order, waited for: the processes are up before the driver and the clock start."""
    workload.submit(
        system.cluster, workload.make_orders(1, workload.FailureRates(0, 0, 0, 0), prefix="warm")
    )
    deadline = time.monotonic() + timeout
    while system.finished() == 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no saga finished within {timeout:.0f} s of the start")
        time.sleep(0.5)


def soak(broker: str, plan: Plan, work_dir: Path) -> list[dict[str, Any]]:
    """The samples of one run on ``broker``."""
    system = System(broker, work_dir)
    total = plan.before + plan.hold + plan.after
    stop = threading.Event()

    def drive() -> None:
        """Orders at ``plan.rate`` a second, a window's worth at a time, until stopped."""

        def stopped(_: int) -> None:
            if stop.is_set():
                raise InterruptedError

        chunk = max(1, round(plan.rate * plan.window))
        for n in itertools.count(1):
            orders = workload.make_orders(
                chunk, workload.FailureRates(0, 0, 0, 0), seed=n, prefix=f"soak{n}"
            )
            try:
                workload.submit(system.cluster, orders, on_progress=stopped, rate=plan.rate)
            except InterruptedError:
                return

    driver = threading.Thread(target=drive, daemon=True)
    samples: list[dict[str, Any]] = []
    holders: ExitStack | None = None
    try:
        _first_saga(system)
        driver.start()
        stop.wait(plan.window)  # the pipeline fills: a window not counted
        started = time.monotonic()
        last = (0.0, system.finished())
        while (now := time.monotonic() - started) < total:
            holding = plan.before <= now < plan.before + plan.hold
            if holding and holders is None:
                holders = ExitStack()
                _hold_snapshots(holders, system.urls)
            elif not holding and holders is not None:
                holders.close()
                holders = None
            stop.wait(min(plan.window, total - now))
            t, finished = time.monotonic() - started, system.finished()
            samples.append(
                {
                    "t_s": round(t, 1),
                    "held": holders is not None,
                    "sagas_per_s": round((finished - last[1]) / (t - last[0]), 2),
                    "finished": finished,
                    "broker_bytes": system.broker_bytes(),
                }
            )
            print(broker, json.dumps(samples[-1]), flush=True)
            last = (t, finished)
    finally:
        if holders is not None:
            holders.close()
        stop.set()
        driver.join()
        system.close()
    return samples


def summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Each held window's rate over the mean rate before the hold, the broker's largest
    table meanwhile, each later window's ratio and how soon one is back at 0.95."""
    held = [n for n, s in enumerate(samples) if s["held"]]
    if not held:
        return {}
    before = [s["sagas_per_s"] for s in samples[: held[0]]]
    free = statistics.mean(before) if before else 0.0
    after = samples[held[-1] + 1 :]
    ratio = [round(s["sagas_per_s"] / free, 3) if free else None for s in samples]
    back = next((s for s in after if free and s["sagas_per_s"] >= 0.95 * free), None)
    sizes = [samples[n]["broker_bytes"] for n in held if samples[n]["broker_bytes"] is not None]
    return {
        "free_sagas_per_s": round(free, 2),
        "held_ratio_per_window": [ratio[n] for n in held],
        "held_ratio_min": min((ratio[n] or 0 for n in held), default=None),
        "after_ratio_per_window": ratio[held[-1] + 1 :],
        "recovered_within_s": round(back["t_s"] - samples[held[-1]]["t_s"]) if back else None,
        "broker_bytes_max_held": max(sizes) if sizes else None,
    }


def run(brokers: list[str], plan: Plan) -> dict[str, Any]:
    """One soak per broker, one after the other: their summaries and samples."""
    result: dict[str, Any] = {"plan": plan.__dict__}
    with tempfile.TemporaryDirectory() as logs:
        for broker in brokers:
            work_dir = Path(logs) / broker
            work_dir.mkdir()
            samples = soak(broker, plan, work_dir)
            result[broker] = {"summary": summary(samples), "samples": samples}
    result["measured_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", nargs="+", choices=BROKERS, default=list(BROKERS))
    parser.add_argument("--rate", type=float, default=Plan.rate, help="orders a second")
    parser.add_argument("--long", action="store_true", help="hold for 10 minutes")
    args = parser.parse_args()
    plan = Plan.long(args.rate) if args.long else Plan(rate=args.rate)
    result = run(args.broker, plan)
    for broker in args.broker:
        print(broker, json.dumps(result[broker]["summary"], indent=2))
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    for name in (f"order-saga-held-snapshot-{stamp}.json", "order-saga-held-snapshot-latest.json"):
        (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
