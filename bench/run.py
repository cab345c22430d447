"""``make bench``: every measurement in one run, on the same servers, side by side.

The relay against raw broker publishing; pgbench running one saga step's transaction (the
ceiling for steps); Celery chains and DBOS workflows doing the same writes (the peers);
events to three subscribers against commands to one service. A peer
or the ceiling that cannot run here is reported as not measured, with the reason.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from bench import (
    broker_baseline,
    ceiling,
    dashboard_latency,
    events,
    lone_delivery,
    peer_celery,
    peer_dbos,
    pg_broker,
    pg_broker_soak,
    profile,
    relay_throughput,
    report,
    saga_e2e,
    saga_sql_ceiling,
    scaling,
    three_step_saga,
)
from bench.environment import ScratchDatabase, machine
from saga.examples.order_saga.orders import create_order_v1, create_order_v2

console = Console()

Row = tuple[str, str, str]
Figures = dict[str, float]

#: The parallel order saga's idle p50 over the sequential one's, at most (issue 31).
PARALLEL_RATIO_TARGET = 0.8


def _attempt(label: str, measure: Callable[[], Any]) -> tuple[Any, str]:
    """Run one optional measurement: (its result, "") or (None, why it failed)."""
    try:
        with console.status(label):
            return measure(), ""
    except Exception as exc:
        reason = " ".join(f"{type(exc).__name__}: {exc}".split()).replace("|", "/")
        console.print(f"[red]{label} failed:[/red] {escape(reason)}")
        return None, reason[:300]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _sweep(figures: dict[Any, float]) -> str:
    return ", ".join(f"{k}: {v:,.0f}" for k, v in figures.items())


def _steps(rate: float, figures: Figures) -> str:
    """Three steps per chain or workflow, as a share of the pgbench ceiling when there is one."""
    steps = f"{3 * rate:,.0f} steps/s"
    ceiling_tps = figures.get("ceiling_step_tps")
    return f"{steps}, {3 * rate / ceiling_tps:.0%} of the ceiling" if ceiling_tps else steps


def _ceiling(args: argparse.Namespace, figures: Figures) -> Row:
    name = "pgbench, one step's transaction (inbox + business update + outbox)"
    top, failed = _attempt(
        "pgbench: one saga step's transaction", lambda: ceiling.step_tps(seconds=args.seconds)
    )
    if top is None:
        return name, "not measured", failed
    tps, clients, sweep = top
    figures |= {"ceiling_step_tps": round(tps), "ceiling_clients": clients}
    return name, f"{tps:,.0f} tx/s", f"ceiling for saga steps; tx/s by clients: {_sweep(sweep)}"


def _celery(args: argparse.Namespace, figures: Figures) -> Row:
    name = f"Celery {_version('celery')}, chains of 3 tasks"
    top, failed = _attempt(
        f"Celery: {args.chains} chains of 3 tasks, per worker setting",
        lambda: peer_celery.best(args.chains),
    )
    if top is None:
        return name, "not measured", failed
    rate, pool, concurrency, sweep = top
    figures |= {"celery_chains_per_s": round(rate), "celery_concurrency": concurrency}
    return (
        f"{name}, {pool} pool x{concurrency}",
        f"{rate:,.0f} chains/s",
        f"{_steps(rate, figures)}; no outbox, no dedup; chains/s by pool: {_sweep(sweep)}",
    )


def _dbos(args: argparse.Namespace, figures: Figures) -> Row:
    name = f"DBOS {_version('dbos')}, workflows of 3 transactions"
    top, failed = _attempt(
        f"DBOS: {args.workflows} workflows of 3 transactions, per setting",
        lambda: peer_dbos.best(args.workflows),
    )
    if top is None:
        return name, "not measured", failed
    rate, (processes, threads), sweep = top
    figures |= {
        "dbos_workflows_per_s": round(rate),
        "dbos_processes": processes,
        "dbos_threads": threads,
    }
    return (
        f"{name}, {processes} process(es) x{threads} threads",
        f"{rate:,.0f} workflows/s",
        f"{_steps(rate, figures)}; workflows/s by processes x threads: {_sweep(sweep)}",
    )


def _three_steps(args: argparse.Namespace, figures: Figures) -> Row:
    """The like-for-like figure: the peers' workload as a saga."""
    name = "saga of 3 remote steps doing the peers' writes"
    with tempfile.TemporaryDirectory() as logs:
        top, failed = _attempt(
            f"three-step sagas: {args.sagas} per setting",
            lambda: three_step_saga.sagas_per_s(args.sagas, Path(logs)),
        )
    if top is None:
        return name, "not measured", failed
    rate, processes, sweep = top
    figures |= {"three_step_sagas_per_s": round(rate, 1), "three_step_orchestrators": processes}
    peers = (("celery_chains_per_s", "Celery chains"), ("dbos_workflows_per_s", "DBOS"))
    versus = [f"{rate / figures[key]:.2f}x {peer}" for key, peer in peers if figures.get(key)]
    return (
        f"{name}, {processes} orchestrator process(es)",
        f"{rate:,.0f} sagas/s",
        "; ".join([*versus, f"sagas/s by orchestrator processes: {_sweep(sweep)}"]),
    )


def _pg_broker(args: argparse.Namespace, figures: Figures) -> list[Row]:
    """The three-step saga with PostgreSQL as the broker, against the same saga on RabbitMQ
    (measured by :func:`_three_steps` in this run, or here when it was not)."""
    rows = [] if figures.get("three_step_sagas_per_s") else [_three_steps(args, figures)]
    name = "saga of 3 remote steps, PostgreSQL as the broker (its own database)"
    with tempfile.TemporaryDirectory() as logs:
        top, failed = _attempt(
            f"three-step sagas on the PostgreSQL broker: {args.sagas} per setting",
            lambda: three_step_saga.sagas_per_s(args.sagas, Path(logs), broker="postgres"),
        )
    if top is None:
        return [*rows, (name, "not measured", failed)]
    rate, processes, sweep = top
    figures |= {"pg_broker_three_step_sagas_per_s": round(rate, 1)}
    notes = [f"sagas/s by orchestrator processes: {_sweep(sweep)}"]
    rabbitmq = figures.get("three_step_sagas_per_s")
    if rabbitmq:
        figures["pg_broker_vs_rabbitmq"] = round(rate / rabbitmq, 3)
        notes.insert(0, f"{rate / rabbitmq:.2f}x the same saga on RabbitMQ (target: 1.0x)")
    return [
        *rows,
        (f"{name}, {processes} orchestrator process(es)", f"{rate:,.0f} sagas/s", "; ".join(notes)),
        *_pg_broker_alone(args, figures),
        *_held_snapshot(args, figures),
        *_order_saga_held(args, figures),
    ]


def _held_snapshot(args: argparse.Namespace, figures: Figures) -> list[Row]:
    """The PostgreSQL broker at full load while another session holds a snapshot for
    ``--held-snapshot-seconds``: each window's rate over the rate before, the table's and
    its indexes' size at the end of the hold, the rate after the release."""
    held = args.held_snapshot_seconds
    if held <= 0:
        return []
    name = f"PostgreSQL broker, a snapshot held {held:.0f} s (full load, windows of 15 s)"
    soak, failed = _attempt(
        name, lambda: pg_broker_soak.run(held + 105, 15, (45, 45 + held))["summary"]
    )
    if soak is None:
        return [(name, "not measured", failed)]
    figures |= {
        "pg_broker_held_snapshot_ratio_min": soak["held_ratio_min"],
        "pg_broker_held_snapshot_ratios": soak["held_ratio_per_window"],
        "pg_broker_held_snapshot_bytes": soak["bytes_at_hold_end"],
        "pg_broker_held_snapshot_recovered_within_s": soak["recovered_within_s"],
    }
    ratios = ", ".join(f"{r:.2f}" for r in soak["held_ratio_per_window"])
    return [
        (
            name,
            f"{soak['held_ratio_min']:.2f} of the rate before, at worst",
            f"{soak['free_msg_per_s']:,} msg/s before; held windows: {ratios}; table + indexes "
            f"{soak['bytes_at_hold_end'] / 1e6:,.0f} MB at the end of the hold; after the "
            f"release: {soak['after_release_msg_per_s']} msg/s",
        )
    ]


def _order_saga_held(args: argparse.Namespace, figures: Figures) -> list[Row]:
    """The order saga at 20 orders/s with a snapshot held 2 minutes on every database, on
    the PostgreSQL broker and on RabbitMQ (``bench.order_saga_soak``; ``--long``: 10 min)."""
    from bench import order_saga_soak

    result, failed = _attempt(
        "order saga, snapshots held",
        lambda: order_saga_soak.run(list(order_saga_soak.BROKERS), order_saga_soak.Plan()),
    )
    rows: list[Row] = []
    for broker in order_saga_soak.BROKERS:
        name = f"order saga, a snapshot held 2 min on every database, {broker}"
        soak = result[broker]["summary"] if result else None
        if not soak:
            rows.append((name, "not measured", failed))
            continue
        figures[f"order_saga_held_ratio_min_{broker}"] = soak["held_ratio_min"]
        size = soak["broker_bytes_max_held"]
        rows.append(
            (
                name,
                f"{soak['held_ratio_min']:.2f} of the rate before, at worst",
                f"{soak['free_sagas_per_s']} sagas/s before; held windows "
                f"{soak['held_ratio_per_window']}; after {soak['after_ratio_per_window']}"
                + (f"; broker table {size / 1e6:.0f} MB at most" if size else ""),
            )
        )
    return rows


def _pg_broker_alone(args: argparse.Namespace, figures: Figures) -> list[Row]:
    """The PostgreSQL transport with no saga: raw throughput, idle commit-to-consume latency."""
    database = ScratchDatabase.create(f"bench_{uuid.uuid4().hex[:6]}_rawbroker", framework=False)
    try:
        raw, failed = _attempt(
            f"PostgreSQL broker, raw: {args.messages} messages",
            lambda: pg_broker.measure(database.url, args.messages, 100),
        )
        idle, idle_failed = _attempt(
            "PostgreSQL broker, idle latency", lambda: pg_broker.idle_latency(database.url)
        )
    finally:
        database.drop()
    rows = []
    name = "PostgreSQL broker, publish + claim + nothing + ack, batches of 100"
    if raw is None:
        rows.append((name, "not measured", failed))
    else:
        figures["pg_broker_raw_msgs_per_s"] = raw["msg_per_s"]
        rows.append((name, f"{raw['msg_per_s']:,} msg/s", "target: 5,000 msg/s"))
    name = "PostgreSQL broker, idle commit-to-consume latency"
    if idle is None:
        rows.append((name, "not measured", idle_failed))
    else:
        figures["pg_broker_idle_p50_ms"] = idle["p50_ms"]
        figures["pg_broker_idle_p99_ms"] = idle["p99_ms"]
        rows.append(
            (name, f"p50 {idle['p50_ms']} ms", f"p99 {idle['p99_ms']} ms; target: p50 10 ms")
        )
    return rows


def _sagas(args: argparse.Namespace, figures: Figures) -> list[Row]:
    """The framework itself: the example order saga, every service a process. Orders of one
    line on version 2 (stock and credit at once), so that the figures compare with the runs
    before version 3 (a fan-out over the lines); v1 idle beside it for the parallel ratio."""
    with tempfile.TemporaryDirectory() as logs:
        bench = saga_e2e.Bench(Path(logs), orchestrator_concurrency=args.concurrency)
        try:
            with console.status(f"order saga, full load: {args.sagas} sagas"):
                bench.measure(min(300, args.sagas), saga=create_order_v2)  # warm up
                cpu_before = profile.CpuSnapshot(bench)
                full = bench.measure(args.sagas, saga=create_order_v2)
                cpu_full = profile.CpuSnapshot(bench).system_seconds() - cpu_before.system_seconds()
            half_rate = full.sagas_per_s / 2
            half_sagas = max(100, int(half_rate * args.half_seconds))
            with console.status(f"order saga, half load: {half_rate:.0f} sagas/s"):
                cpu_before = profile.CpuSnapshot(bench)
                half_e2e = saga_e2e.end_to_end(bench, half_rate, half_sagas, create_order_v2)
                cpu_half = profile.CpuSnapshot(bench).system_seconds() - cpu_before.system_seconds()
            half = half_e2e.measurement
            with console.status("letting the server settle (checkpoint, autovacuum)"):
                bench.settle()
            with console.status(
                f"order saga, idle: {args.idle_sagas} sagas on v2 and on v1 (sequential), "
                "alternating, 1 a second"
            ):
                idle_e2e, sequential_e2e = saga_e2e.end_to_end_alternating(
                    bench, 1.0, args.idle_sagas, create_order_v2, create_order_v1
                )
            group = _group_cost(bench, idle_e2e, sequential_e2e)
            rss = bench.consumer_rss_mb()
            grown = None
            if args.growth_rows:
                with console.status(f"growth: {args.growth_rows:,} rows in inbox and step log"):
                    bench.preload_history(args.growth_rows)
                    bench.measure(min(300, args.sagas), saga=create_order_v2)
                    grown = bench.measure(args.sagas, saga=create_order_v2)
        finally:
            bench.close()
    cpu_ratio = (cpu_half / half_sagas) / (cpu_full / args.sagas)
    parallel_ratio = idle_e2e.duration_ms["p50"] / sequential_e2e.duration_ms["p50"]
    figures |= {
        "sagas_per_s": round(full.sagas_per_s, 1),
        "steps_per_s": round(full.steps_per_s),
        "latency_ms_p50": full.latency_ms["p50"],
        "latency_ms_p95": full.latency_ms["p95"],
        "latency_ms_p99": full.latency_ms["p99"],
        "half_load_sagas_per_s": round(half.sagas_per_s, 1),
        "half_load_latency_ms_p50": half.latency_ms["p50"],
        "half_load_latency_ms_p95": half.latency_ms["p95"],
        "half_load_latency_ms_p99": half.latency_ms["p99"],
        "consumer_rss_mb": round(rss, 1),
        "e2e_idle_ms_p50": idle_e2e.duration_ms["p50"],
        "e2e_idle_ms_p99": idle_e2e.duration_ms["p99"],
        "e2e_half_ms_p50": half_e2e.duration_ms["p50"],
        "e2e_half_ms_p99": half_e2e.duration_ms["p99"],
        "half_cpu_per_saga_ratio": round(cpu_ratio, 3),
        "e2e_sequential_idle_ms_p50": sequential_e2e.duration_ms["p50"],
        "parallel_e2e_ratio": round(parallel_ratio, 3),
        "sequential_stock_step_ms_p50": group.stock_ms,
        "sequential_credit_step_ms_p50": group.credit_ms,
        "parallel_group_ms_p50": group.group_ms,
        "parallel_e2e_ratio_floor": round(group.floor, 3),
    }
    rows = [
        (
            "order saga (4 remote + 2 local steps), full load",
            f"{full.sagas_per_s:,.0f} sagas/s, {full.steps_per_s:,.0f} steps/s",
            _versus(full, figures),
        ),
        (
            "commit-to-consume latency, full load",
            _latency(full),
            "from the commit of a message's outbox row to the commit of its consumer's transaction",
        ),
        (
            f"commit-to-consume latency, half load ({half.sagas_per_s:,.0f} sagas/s)",
            _latency(half),
            "targets: p50 < 10 ms, p99 < 50 ms",
        ),
        (
            f"order saga end to end (v2, stock and credit at once), idle "
            f"({args.idle_sagas} sagas, alternating with v1, 1 saga a second)",
            _durations(idle_e2e),
            "finished_at - started_at of each saga, started one per transaction",
        ),
        (
            f"order saga v1, stock and credit reserved one after the other, idle "
            f"({args.idle_sagas} sagas, alternating with v2)",
            _durations(sequential_e2e),
            f"the parallel version 2 (the row above) at {parallel_ratio:.2f} of its p50 "
            f"(target: at most {PARALLEL_RATIO_TARGET})",
        ),
        (
            "the reservations of the idle sagas above: v2's group against v1's steps",
            f"group p50 {group.group_ms:,.1f} ms; v1: stock {group.stock_ms:,.1f} ms, "
            f"then credit {group.credit_ms:,.1f} ms",
            f"the group costs {group.over_one_step:,.1f} ms more than the stock step alone; "
            f"a group costing nothing more would give a ratio of {group.floor:.2f}, and "
            f"{PARALLEL_RATIO_TARGET} needs it within "
            f"{group.allowance(PARALLEL_RATIO_TARGET):,.1f} ms of one step "
            "(step log, started_at to finished_at)",
        ),
        (
            f"order saga end to end, half load ({half.sagas_per_s:,.0f} sagas/s)",
            _durations(half_e2e),
            f"{half_e2e.duration_ms['p50'] / idle_e2e.duration_ms['p50']:.1f}x idle p50, "
            f"{half_e2e.duration_ms['p99'] / idle_e2e.duration_ms['p99']:.1f}x idle p99 "
            "(targets: at most 2x, 4x)",
        ),
        (
            "CPU per saga at half load over full load",
            f"{cpu_ratio:.2f}",
            f"every process but the driver (services, relays, PostgreSQL, RabbitMQ): "
            f"{1000 * cpu_half / half_sagas:.1f} vs {1000 * cpu_full / args.sagas:.1f} ms "
            "per saga (target: at most 1.4)",
        ),
        ("resident memory of one consumer (orders)", f"{rss:,.0f} MB", "after the runs above"),
    ]
    if grown is not None:
        ratio = grown.sagas_per_s / full.sagas_per_s
        figures["growth_throughput_ratio"] = round(ratio, 3)
        figures["growth_rows"] = args.growth_rows
        rows.append(
            (
                f"order saga with {args.growth_rows:,} rows in every inbox and the step log",
                f"{grown.sagas_per_s:,.0f} sagas/s",
                f"{ratio:.0%} of the empty-table throughput (target: at least 90%)",
            )
        )
    return rows


@dataclass(frozen=True)
class GroupCost:
    """The order saga's reservations, idle: p50s in milliseconds, from the step log, of v2's
    parallel group (stock and credit at once) and of v1's two steps (stock, then credit),
    beside v1's whole saga."""

    group_ms: float
    stock_ms: float
    credit_ms: float
    sequential_ms: float

    @property
    def over_one_step(self) -> float:
        """What the group costs over its stock step alone, in milliseconds."""
        return self.group_ms - self.stock_ms

    @property
    def floor(self) -> float:
        """v2 ÷ v1 were the group to cost no more than its stock step alone (the saga's
        other steps as they were): v1 without its credit step."""
        return (self.sequential_ms - self.credit_ms) / self.sequential_ms

    def allowance(self, ratio: float) -> float:
        """How much more than the stock step alone the group may cost for v2 ÷ v1 to be
        ``ratio``: what it saves (the credit step) less what the ratio gives up."""
        return self.credit_ms - (1 - ratio) * self.sequential_ms


def _group_cost(
    bench: saga_e2e.Bench, parallel: saga_e2e.EndToEnd, sequential: saga_e2e.EndToEnd
) -> GroupCost:
    def p50(batch: str, *steps: str) -> float:
        return round(statistics.median(bench.step_durations_ms(batch, steps)), 2)

    return GroupCost(
        group_ms=p50(parallel.batch, "reserve_stock", "reserve_credit"),
        stock_ms=p50(sequential.batch, "reserve_stock"),
        credit_ms=p50(sequential.batch, "reserve_credit"),
        sequential_ms=sequential.duration_ms["p50"],
    )


def _latency(m: saga_e2e.Measurement) -> str:
    return " / ".join(f"{k} {v:,.1f} ms" for k, v in m.latency_ms.items())


def _durations(e2e: saga_e2e.EndToEnd) -> str:
    return " / ".join(f"{k} {v:,.1f} ms" for k, v in e2e.duration_ms.items())


def _saga_sql(args: argparse.Namespace, figures: Figures) -> list[Row]:
    """pgbench replaying one saga's own SQL, and sagas/s as a share of it beside the old one."""
    rows = []
    for key, name, measure, rate_key in (
        ("three_step", "three-step saga", saga_sql_ceiling.three_step, "three_step_sagas_per_s"),
        ("order", "order saga", saga_sql_ceiling.order, "sagas_per_s"),
    ):
        label = f"pgbench replaying one {name}'s SQL, every service's share at once"
        top, failed = _attempt(
            f"{name}: capturing its SQL, replaying it with pgbench",
            functools.partial(measure, args.seconds),
        )
        if top is None:
            rows.append((label, "not measured", failed))
            continue
        ceiling: saga_sql_ceiling.Ceiling = top
        (report.RESULTS / f"saga-sql-{key.replace('_', '-')}-latest.pgbench").write_text(
            ceiling.scripts()
        )
        figures |= {
            f"saga_sql_ceiling_{key}_sagas_per_s": round(ceiling.sagas_per_s, 1),
            f"saga_sql_statements_{key}": ceiling.statements,
            f"saga_sql_transactions_{key}": ceiling.transactions,
        }
        notes = [
            f"{ceiling.statements} statements in {ceiling.transactions} transactions "
            f"(per service and transaction: {ceiling.breakdown()}; BEGIN/COMMIT not counted)",
            f"sagas/s by clients: {_sweep(ceiling.sweep)}",
        ]
        if figures.get(rate_key):
            ratio = figures[rate_key] / ceiling.sagas_per_s
            figures[f"saga_sql_ceiling_ratio_{key}"] = round(ratio, 3)
            notes.insert(0, f"{name} at {ratio:.2f} of it")
        rows.append((label, f"{ceiling.sagas_per_s:,.0f} sagas/s", "; ".join(notes)))
    if "saga_sql_ceiling_ratio_order" in figures:
        figures["saga_sql_ceiling_ratio"] = figures["saga_sql_ceiling_ratio_order"]
    return rows


def _ratios(figures: Figures) -> None:
    """The issue-13 ratios: sagas over Celery chains, steps over the one-step ceiling."""
    celery, ceiling_tps = figures.get("celery_chains_per_s"), figures.get("ceiling_step_tps")
    for key, rate in (
        ("three_step_vs_celery", figures.get("three_step_sagas_per_s")),
        ("order_vs_celery", figures.get("sagas_per_s")),
    ):
        if celery and rate:
            figures[key] = round(rate / celery, 3)
    if ceiling_tps and figures.get("steps_per_s"):
        figures["step_ceiling_ratio"] = round(figures["steps_per_s"] / ceiling_tps, 3)


def _versus(full: saga_e2e.Measurement, figures: Figures) -> str:
    parts = []
    if figures.get("ceiling_step_tps"):
        parts.append(
            f"steps at {full.steps_per_s / figures['ceiling_step_tps']:.0%} of the ceiling"
        )
    if figures.get("celery_chains_per_s"):
        parts.append(f"{full.sagas_per_s / figures['celery_chains_per_s']:.1f}x Celery chains")
    if figures.get("dbos_workflows_per_s"):
        parts.append(f"{full.sagas_per_s / figures['dbos_workflows_per_s']:.1f}x DBOS workflows")
    return "; ".join(parts)


def _events(args: argparse.Namespace, figures: Figures) -> list[Row]:
    """Events to three subscribers against commands to one service, same run and servers."""
    count = min(args.messages, 20_000)
    label = f"{count:,} events to 3 subscribers vs {count:,} commands to 1 service"
    found, failed = _attempt(label, lambda: events.measure(count))
    if found is None:
        return [(label, "not measured", failed)]
    figures |= {
        "commands_per_s": found["commands_per_s"],
        "events_per_s": found["events_per_s"],
        "event_deliveries_per_s": found["event_deliveries_per_s"],
        "event_deliveries_vs_commands": found["deliveries_vs_commands"],
    }
    return [
        (
            f"commands to 1 service ({count:,}, one relay, one consumer)",
            f"{found['commands_per_s']:,.0f} commands/s",
            "from the commit of the outbox rows to the last handled",
        ),
        (
            f"events to 3 subscribers ({count:,}, one relay, a consumer each)",
            f"{found['events_per_s']:,.0f} events/s, "
            f"{found['event_deliveries_per_s']:,.0f} deliveries/s",
            f"deliveries at {found['deliveries_vs_commands']:.2f}x the commands' rate",
        ),
    ]


def _dashboard(args: argparse.Namespace, figures: Figures) -> list[Row]:
    """Each dashboard page's p95 over HTTP with ``--dashboard-sagas`` sagas stored."""
    label = f"dashboard pages with {args.dashboard_sagas:,} sagas"
    found, failed = _attempt(label, lambda: dashboard_latency.measure(args.dashboard_sagas))
    if found is None:
        return [(label, "not measured", failed)]
    pages, filled = found
    figures["dashboard_sagas"] = args.dashboard_sagas
    figures["dashboard_fill_s"] = round(filled)
    rows = []
    target = dashboard_latency.TARGET_MS
    for page, figure in pages.items():
        key = "dashboard_" + "".join(c if c.isalnum() else "_" for c in page).strip("_")
        figures[f"{key}_p95_ms"] = figure["p95_ms"]
        verdict = "under" if figure["p95_ms"] < target else "OVER"
        rows.append(
            (
                f"dashboard: {page} ({args.dashboard_sagas:,} sagas)",
                f"p95 {figure['p95_ms']:.0f} ms (p50 {figure['p50_ms']:.0f} ms)",
                f"{verdict} the {target:.0f} ms target; over HTTP, {len(pages)} pages",
            )
        )
    return rows


def _scaling(args: argparse.Namespace, figures: Figures) -> list[Row]:
    """The order saga with 1, 2 and 4 consumer processes per service, and 1 at half load;
    the capacity model's prediction of each from the two 1-process runs' costs; its
    projection onto more machines."""
    runs = []
    for processes in scaling.PROCESS_COUNTS:
        label = f"order saga, {processes} consumer process(es) per service"
        run, failed = _attempt(label, lambda n=processes: scaling.measure(n, args.sagas))
        if run is None:
            return [(label, "not measured", failed)]
        runs.append(run)
    label = "order saga, 1 consumer process per service at half load"
    half_rate = runs[0].sagas_per_s / 2
    part_load, failed = _attempt(
        label, lambda: scaling.measure(1, args.sagas // 2, paced_at=half_rate)
    )
    if part_load is None:
        return [(label, "not measured", failed)]
    found, rows = scaling.figures_and_rows(runs, part_load)
    figures |= found
    for hosts in (1, 4, 16, 64):
        where = scaling.Deployment(hosts=hosts)
        tiers = scaling.project(runs[0], where)
        limit = min(tiers, key=lambda name: tiers[name])
        figures[f"projection_{hosts}_hosts_sagas_per_s"] = round(tiers[limit])
        rows.append(
            (
                f"projection: {hosts} hosts of {where.cores_per_host} cores",
                f"{tiers[limit]:,.0f} sagas/s",
                f"bound by {limit}; "
                + ", ".join(f"{name} {value:,.0f}" for name, value in tiers.items()),
            )
        )
    return rows


def _lone_delivery(args: argparse.Namespace, figures: Figures) -> list[Row]:
    """The framework commands PostgreSQL receives for a delivery that arrives alone."""
    name = "framework commands of a lone delivery (server statement log)"
    found, failed = _attempt("one delivery alone, statements logged", lone_delivery.measure)
    if found is None:
        return [(name, "not measured", failed)]
    figures["lone_delivery_commands"] = found.commands
    detail = f"{len(found.transaction)} in its transaction + {len(found.publishing)} to publish"
    return [(name, str(found.commands), f"{detail}; target: at most 4 + 0")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=50_000, help="messages per measurement")
    parser.add_argument("--batch-size", type=int, default=500, help="relay batch size")
    parser.add_argument("--chains", type=int, default=2_000, help="Celery chains per setting")
    parser.add_argument("--workflows", type=int, default=1_000, help="DBOS workflows per setting")
    parser.add_argument("--seconds", type=int, default=4, help="pgbench run per client count")
    parser.add_argument("--sagas", type=int, default=3_000, help="order sagas at full load")
    parser.add_argument(
        "--half-seconds", type=float, default=15, help="length of the half-load run"
    )
    parser.add_argument(
        "--idle-sagas", type=int, default=45, help="sagas of the idle run, one a second"
    )
    parser.add_argument(
        "--growth-rows",
        type=int,
        default=5_000_000,
        help="history rows for the growth run (0: skip)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=1, help="worker threads of the orchestrator (orders)"
    )
    parser.add_argument("--only-sagas", action="store_true", help="measure the saga runs alone")
    parser.add_argument(
        "--only-saga-sql",
        action="store_true",
        help="measure the pgbench replay of one saga's SQL alone (bench.saga_sql_ceiling)",
    )
    parser.add_argument(
        "--only-pg-broker",
        action="store_true",
        help="measure the three-step saga on PostgreSQL as the broker and on RabbitMQ alone",
    )
    parser.add_argument(
        "--held-snapshot-seconds",
        type=float,
        default=120,
        help="how long the PostgreSQL broker's soak holds a snapshot (600: the 10-minute "
        "run; 0: skip)",
    )
    parser.add_argument(
        "--only-dashboard",
        action="store_true",
        help="measure the dashboard's list and detail pages alone (bench.dashboard_latency)",
    )
    parser.add_argument(
        "--dashboard-sagas", type=int, default=1_000_000, help="sagas stored for the dashboard"
    )
    parser.add_argument(
        "--only-events",
        action="store_true",
        help="measure events to three subscribers against commands to one alone (bench.events)",
    )
    parser.add_argument(
        "--only-scaling",
        action="store_true",
        help="measure the order saga with 1, 2 and 4 consumer processes per service and the "
        "capacity model's predictions alone (bench.scaling)",
    )
    parser.add_argument(
        "--only-lone-delivery",
        action="store_true",
        help="count the framework commands of a delivery alone (bench.lone_delivery) alone",
    )
    args = parser.parse_args()
    partial = {
        "scaling": (args.only_scaling, _scaling),
        "pg-broker": (args.only_pg_broker, _pg_broker),
        "saga-sql": (args.only_saga_sql, _saga_sql),
        "sagas": (args.only_sagas, _sagas),
        "dashboard": (args.only_dashboard, _dashboard),
        "events": (args.only_events, _events),
        "lone-delivery": (args.only_lone_delivery, _lone_delivery),
    }
    for name, (chosen, measure) in partial.items():
        if chosen:
            figures_alone: Figures = {}
            rows_alone = measure(args, figures_alone)
            path = report.write(figures_alone, rows_alone, machine(), name=name)
            console.print(path.read_text(), soft_wrap=True, markup=False, highlight=False)
            return

    with console.status("raw broker publishes (per-message confirms)"):
        confirm = broker_baseline.publish_rate(min(args.messages, 5_000), "confirm")
    with console.status("raw broker publishes (AMQP transactions)"):
        tx = broker_baseline.publish_rate(args.messages, "tx", args.batch_size)
    with console.status("raw broker publishes (no confirms, not durable)"):
        none = broker_baseline.publish_rate(args.messages, "none")
    with console.status(f"relay draining {args.messages} outbox rows"):
        relay = relay_throughput.relay_rate(args.messages, args.batch_size)

    figures = {
        "relay_msgs_per_s": round(relay),
        "relay_batch_size": args.batch_size,
        "broker_publish_tx_msgs_per_s": round(tx),
        "broker_publish_confirm_msgs_per_s": round(confirm),
        "broker_publish_unconfirmed_msgs_per_s": round(none),
        "relay_to_broker_tx_ratio": round(relay / tx, 3),
    }
    rows = [
        (
            f"relay, durable, batches of {args.batch_size}",
            f"{relay:,.0f} msg/s",
            f"{relay / tx:.0%} of raw tx publishing",
        ),
        (
            f"raw kombu publish, AMQP tx of {args.batch_size}",
            f"{tx:,.0f} msg/s",
            "ceiling for a durable relay",
        ),
        (
            "raw kombu publish, confirm per message",
            f"{confirm:,.0f} msg/s",
            "naive durable publishing",
        ),
        ("raw kombu publish, no confirms", f"{none:,.0f} msg/s", "not durable"),
    ]
    rows += [_ceiling(args, figures), _celery(args, figures), _dbos(args, figures)]
    rows.append(_three_steps(args, figures))
    rows += _pg_broker(args, figures)
    rows += _events(args, figures)
    rows += _sagas(args, figures)
    rows += _lone_delivery(args, figures)
    rows += _saga_sql(args, figures)
    rows += _dashboard(args, figures)
    _ratios(figures)
    path = report.write(figures, rows, machine())
    console.print(path.read_text(), soft_wrap=True, markup=False, highlight=False)


if __name__ == "__main__":
    main()
