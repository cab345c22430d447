"""``make demo``: the order saga end to end, six services as separate processes.

Orders and the saga's three participants, and the two services that subscribe to the
events orders publishes (notifications, analytics). With no ``SAGA_DATABASE_URL``, an
embedded PostgreSQL holds the service databases and, with no ``SAGA_BROKER_URL``, also
the broker (the framework's own PostgreSQL transport, in a database of its own). With
them set, the demo uses those servers: one database per service is created on
``SAGA_DATABASE_URL``'s server.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path

import psycopg
from psycopg import sql
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from saga.cli.sagas import render_saga, timeline_entries
from saga.db.embedded import EmbeddedPostgres, database_url
from saga.engine.store import SagaStore
from saga.examples.order_saga import invariants, workload
from saga.examples.order_saga.cluster import SERVICES, Cluster
from saga.examples.order_saga.processes import SagaProcess
from saga.operations.branches import branches

console = Console()
WORK_DIR = Path(os.environ.get("SAGA_DEMO_DIR", ".demo"))
#: What a consumer writes once consuming and its relay thread once connected: orders are
#: submitted after that, so the timelines measure the framework, not how long the
#: processes take to start.
READY_LINES = ("consuming", "relay connected")


def _fresh_database(server_url: str, name: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return database_url(server_url, name)


@contextmanager
def servers(stack: ExitStack) -> Iterator[tuple[dict[str, str], str, str]]:
    """(database URL per service, broker URL, description) for this run."""
    server_url = os.environ.get("SAGA_DATABASE_URL")
    broker_url = os.environ.get("SAGA_BROKER_URL")
    where = []
    if server_url:
        where.append("PostgreSQL from SAGA_DATABASE_URL")
    else:
        with console.status("starting an embedded PostgreSQL"):
            embedded = EmbeddedPostgres(WORK_DIR / "pg")
        stack.callback(embedded.stop)
        server_url = embedded.admin_url
        where.append(f"embedded PostgreSQL in {embedded.data_dir}")
    names = [f"saga_demo_{s}" for s in SERVICES] + ([] if broker_url else ["saga_demo_broker"])
    with ThreadPoolExecutor(len(names)) as pool:  # each CREATE DATABASE mostly waits on I/O
        created = pool.map(partial(_fresh_database, server_url), names)
        fresh = dict(zip(names, created, strict=True))
    urls = {s: fresh[f"saga_demo_{s}"] for s in SERVICES}
    if broker_url:
        where.append("broker from SAGA_BROKER_URL")
    else:
        broker_url = fresh["saga_demo_broker"]
        _create_broker_table(broker_url)
        where.append("broker: PostgreSQL (the framework's transport) on the same server")
    yield urls, broker_url, "; ".join(where)


def _create_broker_table(url: str) -> None:
    """Create the broker's table here, once, before eight processes connect."""
    from saga.broker.transport import BrokerConfig

    with BrokerConfig(url).connect() as conn:
        conn.ensure_connection(max_retries=1)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def run(
    orders: int = 200, timeout: float = 90.0, flakiness: float = 0.02, rate: float = 50.0
) -> int:
    """Run the demo; return the exit code (0 when every saga settled and invariants hold)."""
    started = time.monotonic()
    WORK_DIR.mkdir(exist_ok=True)
    logs = WORK_DIR / "logs"
    logs.mkdir(exist_ok=True)
    with ExitStack() as stack, servers(stack) as (urls, broker_url, where):
        console.print(f"[bold]order saga demo[/bold]: {where}")
        system = Cluster(
            urls,
            broker_url,
            extra_env={"ORDER_SAGA_FLAKINESS": str(flakiness)},
            relay_in_consumer=True,
        )
        with console.status(f"migrating {len(SERVICES)} service databases and seeding them"):
            system.prepare()
        processes = [SagaProcess(args, env, logs, name) for name, args, env in system.commands()]
        stack.callback(_stop, processes)
        with console.status("waiting for the relays and consumers to connect"):
            for process in processes:
                if process.args[0] == "consume":
                    for line in READY_LINES:
                        process.wait_for_output(line, timeout)
        console.print(
            f"started {len(processes)} processes (a consumer per service, relaying its "
            f"outbox too, and the payment gateway); logs in {logs}/"
        )
        batch = workload.make_orders(orders, workload.FailureRates(), seed=int(time.time()))
        with _progress() as progress:
            submitted = progress.add_task("submitting orders", total=orders)
            workload.submit(
                system, batch, on_progress=lambda n: progress.advance(submitted, n), rate=rate
            )
            settled = progress.add_task("sagas finished", total=orders)
            counts = workload.wait_until_settled(
                system, orders, timeout, on_progress=lambda n: progress.advance(settled, n)
            )
        with console.status("waiting for notifications and analytics to catch up"):
            workload.wait_for_events(system, timeout)
        _outcomes(system, counts)
        _events(system)
        _step_latency(system)
        _timelines(system)
        report = invariants.check(system)
        _invariants(report)
        _stop(processes)
        unsettled = counts.get("running", 0) + counts.get("compensating", 0)
        console.print(f"demo finished in {time.monotonic() - started:.1f}s")
        return 0 if report.ok and unsettled == 0 else 1


def _stop(processes: list[SagaProcess]) -> None:
    for process in processes:
        if process.returncode is None:
            process.proc.terminate()
    for process in processes:
        process.wait(30)


def _outcomes(system: Cluster, counts: dict[str, int]) -> None:
    table = Table(title="outcomes")
    table.add_column("status")
    table.add_column("sagas", justify="right")
    statuses = ("completed", "compensated", "running", "compensating", "compensation_failed",
                "step_dead_lettered")  # fmt: skip
    for status in statuses:
        if counts.get(status):
            table.add_row(status, str(counts[status]))
    console.print(table)
    with system.connect("orders") as conn:
        reasons = conn.execute(
            "SELECT split_part(last_error, ':', 1) AS step, count(*) FROM saga.saga_instances "
            "WHERE status = 'compensated' GROUP BY 1 ORDER BY 2 DESC"
        ).fetchall()
    if reasons:
        table = Table(title="why sagas compensated (failed step)")
        table.add_column("step")
        table.add_column("sagas", justify="right")
        for step, count in reasons:
            table.add_row(step, str(count))
        console.print(table)


def _events(system: Cluster) -> None:
    """What the subscribers of orders' events did: notices sent, approved amounts counted."""
    table = Table(title="events orders published, as their subscribers handled them")
    for column in ("service", "event", "handled", "effect"):
        table.add_column(column, justify="right" if column == "handled" else "left")
    notices = dict(invariants.rows(system, "notifications",
                                   "SELECT kind, count(*) FROM notices GROUP BY kind"))  # fmt: skip
    totals = invariants.rows(
        system, "analytics",
        "SELECT coalesce(sum(orders), 0), coalesce(sum(amount_cents), 0) FROM approved_totals",
    )[0]  # fmt: skip
    table.add_row("notifications", "OrderApproved", str(notices.get("approved", 0)), "a notice")
    table.add_row("notifications", "OrderRejected", str(notices.get("rejected", 0)), "a notice")
    table.add_row(
        "analytics", "OrderApproved", str(totals[0]), f"{totals[1] / 100:,.2f} approved in total"
    )
    console.print(table)


_STEP_LATENCY = """
SELECT step, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ms),
       max(duration_ms)
FROM saga.saga_timeline WHERE phase = 'forward' AND outcome = 'succeeded'
GROUP BY step ORDER BY min(seq)
"""


def _step_latency(system: Cluster) -> None:
    """Each forward step's duration (sent to answered, or the local step's own time)."""
    table = Table(title="step durations (ms)")
    for column in ("step", "steps", "p50", "p99", "max"):
        table.add_column(column, justify="left" if column == "step" else "right")
    with system.connect("orders") as conn:
        for step, count, p50, p99, longest in conn.execute(_STEP_LATENCY).fetchall():
            table.add_row(step, str(count), f"{p50:.1f}", f"{p99:.1f}", f"{longest:.1f}")
    console.print(table)


def _timelines(system: Cluster) -> None:
    store = SagaStore("saga")
    with system.connect("orders") as conn:
        for saga_id in workload.sample_sagas(system, ("completed", "compensated")):
            record = store.load(conn, saga_id)
            assert record is not None
            console.print()
            branch_of = branches(conn, "saga", record.name, record.saga_version)
            render_saga(record, timeline_entries(store.timeline(conn, saga_id), branch_of))


def _invariants(report: invariants.Report) -> None:
    if report.ok:
        figures = ", ".join(f"{k}={v}" for k, v in sorted(report.figures.items()))
        console.print(f"[green]business invariants hold[/green] ({figures})")
    else:
        for violation in report.violations:
            console.print(f"[red]invariant violated:[/red] {violation}")
