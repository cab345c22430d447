"""A fan-out of 1,000 items: how long it takes, how big its state is, what it costs in SQL.

``python -m bench.fan_out [--items N] [--broker rabbitmq|postgres|both]``: the saga of
:mod:`bench._fan_out_app` (one ``for_each`` over the order's lines, at most 50 out, then a
confirmation) on scratch databases, its orchestrator, its participant and their relays as
separate ``saga`` processes. One saga completes (every line reserved, the quantity gathered
into the data), then one whose confirmation fails compensates (every line released, at
most 50 out, as forward). For each: seconds from the start's commit to the end (and, for
the one that compensates, from the moment it was first seen compensating: the time to
undo the items alone); the saga's data and, at its largest (sampled every 20 ms while it
runs), its step state, as stored (jsonb bytes); and the statements PostgreSQL received for
each item on the saga's database and on the participant's, read from the server's
statement log (``log_statement = 'all'`` on those databases alone). Results:
``bench/results/fan-out-latest.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg

from bench import report
from bench._fan_out_app import TABLE, Line, Order, order
from bench.environment import ADMIN_URL, AMQP_URL, ScratchDatabase, machine
from bench.statement_log import log_window, parse
from saga.examples.order_saga.cluster import delete_queues
from saga.examples.order_saga.processes import saga_env
from tests.rig.supervisor import Supervisor

APP = "bench._fan_out_app"
ITEMS = 1000  # a run of another size, or on one broker, saves under a name of its own
SIZES = """SELECT pg_column_size(data), pg_column_size(step_state), status
FROM saga.saga_instances WHERE id = %s"""


class FanOutBench:
    """The orchestrator and the participant, with their relays, on scratch databases."""

    def __init__(self, work_dir: Path, broker: str) -> None:
        run_id = uuid.uuid4().hex[:6]
        self.prefix = f"fan{run_id}."
        self.home = ScratchDatabase.create(f"bench_{run_id}_orders", log_statements=True)
        self.stock = ScratchDatabase.create(f"bench_{run_id}_stock", log_statements=True)
        self.broker_db = (
            ScratchDatabase.create(f"bench_{run_id}_broker", framework=False)
            if broker == "postgres"
            else None
        )
        with psycopg.connect(self.stock.url) as conn:
            conn.execute(TABLE)
        broker_url = self.broker_db.url if self.broker_db is not None else AMQP_URL
        commands = []
        for name, database, target in (
            ("orders", self.home, "registry"),
            ("stock", self.stock, "service"),
        ):
            env = saga_env(database.url, broker_url, self.prefix)
            commands.append((f"{name}-relay", ["relay"], env))
            commands.append((name, ["consume", f"{APP}:{target}"], env))
        self.supervisor = Supervisor(commands, work_dir)

    def run(self, data: Order, status: str) -> dict[str, float]:
        """One saga from its start to ``status``: seconds, sizes, statements."""
        with log_window(ADMIN_URL, [self.home.name, self.stock.name]) as lines:
            began = time.monotonic()
            with psycopg.connect(self.home.url) as conn, conn.transaction():
                saga_id = order.start(conn, data)
            data_bytes, state_peak, compensating_at = self._follow(saga_id, status)
            ended = time.monotonic()
            took = ended - began
        by_database = {self.home.name: 0, self.stock.name: 0}
        for transaction in parse(lines):
            by_database[transaction.database] += len(transaction.statements)
        items = len(data.lines)
        undo = {}
        if compensating_at is not None:
            undo_seconds = ended - compensating_at
            undo = {
                "undo_seconds": round(undo_seconds, 2),
                "undone_items_per_s": round(items / undo_seconds, 1),
            }
        return {
            "seconds": round(took, 2),
            "items_per_s": round(items / took, 1),
            **undo,
            "data_bytes": data_bytes,
            "step_state_peak_bytes": state_peak,
            "orchestrator_statements_per_item": round(by_database[self.home.name] / items, 2),
            "participant_statements_per_item": round(by_database[self.stock.name] / items, 2),
        }

    def _follow(self, saga_id: uuid.UUID, status: str) -> tuple[int, int, float | None]:
        """Sample the saga until it reaches ``status``: its data's size then, its step
        state's largest size on the way, and when it was first seen compensating (None:
        never)."""
        deadline = time.monotonic() + 1800
        peak = 0
        compensating_at = None
        with psycopg.connect(self.home.url, autocommit=True) as conn:
            while True:
                row = conn.execute(SIZES, (saga_id,)).fetchone()
                assert row is not None
                peak = max(peak, row[1] or 0)
                if row[2] == "compensating" and compensating_at is None:
                    compensating_at = time.monotonic()
                if row[2] == status:
                    return int(row[0]), peak, compensating_at
                if row[2] not in ("running", "compensating"):
                    raise RuntimeError(f"saga {saga_id} is {row[2]}, not {status}")
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"saga {saga_id} not {status} after 30 minutes")
                threading.Event().wait(0.02)

    def close(self) -> None:
        self.supervisor.stop()
        for database in (self.home, self.stock, self.broker_db):
            if database is not None:
                database.drop()
        if self.broker_db is None:
            delete_queues(AMQP_URL, self.prefix, ("orders", "stock"))


def measure(items: int, broker: str, work_dir: Path) -> dict[str, dict[str, float]]:
    lines = [Line(sku=f"sku-{n:05d}") for n in range(items)]
    bench = FanOutBench(work_dir / broker, broker)
    try:
        bench.run(Order(lines=lines[:10]), "completed")  # warm-up: processes up, caches filled
        return {
            "complete": bench.run(Order(lines=lines), "completed"),
            "compensate": bench.run(Order(lines=lines, confirm_fails=True), "compensated"),
        }
    finally:
        bench.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=ITEMS)
    parser.add_argument("--broker", choices=("rabbitmq", "postgres", "both"), default="both")
    args = parser.parse_args()
    brokers = ("rabbitmq", "postgres") if args.broker == "both" else (args.broker,)
    figures: dict[str, float] = {"items": args.items}
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="fan-out-") as logs:
        for broker in brokers:
            for run, result in measure(args.items, broker, Path(logs)).items():
                for name, value in result.items():
                    figures[f"{broker}_{run}_{name}"] = value
                undo = (
                    f", of which {result['undo_seconds']} s to undo them "
                    f"({result['undone_items_per_s']} items/s)"
                    if "undo_seconds" in result
                    else ""
                )
                rows.append(
                    (
                        f"{args.items} items, {broker}, to {run}",
                        f"{result['seconds']} s ({result['items_per_s']} items/s){undo}; data "
                        f"{result['data_bytes']} B, step state at most "
                        f"{result['step_state_peak_bytes']} B; statements per item: "
                        f"{result['orchestrator_statements_per_item']} orchestrator, "
                        f"{result['participant_statements_per_item']} participant",
                        "cap 50 in flight, forward and compensating",
                    )
                )
                print(rows[-1], flush=True)
    full = args.items == ITEMS and args.broker == "both"
    name = "fan-out" if full else f"fan-out-{args.items}-{args.broker}"
    print(report.write(figures, rows, machine(), name=name))


if __name__ == "__main__":
    main()
