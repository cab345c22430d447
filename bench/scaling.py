"""Horizontal runs: the order saga with 1, 2 and 4 consumer processes per service, and the
capacity model of docs/scaling.md, predicting each run from the 1-process costs.

Each run starts a fresh system of :mod:`bench.saga_e2e` (the four services, a relay each,
the payment gateway; every one a process of its own) with N consumer processes per
service, as if on N hosts sharing each service's database and the broker. After a warm-up
it starts ``sagas`` orders at once and reads every process's CPU time from ``/proc``
before and after (as ``make profile`` does): sagas/s, and CPU milliseconds per saga for
each kind of process, PostgreSQL, RabbitMQ and the whole machine.

The model takes the costs of the 1-process run alone. A saga costs ``machine_ms`` of CPU
on this box (every process, the servers and the kernel), so the machine carries at most
``cores * 1000 / machine_ms`` sagas/s; a consumer process runs its Python on one core at a
time (the GIL), so a service whose consumers spend ``service_ms`` per saga carries at most
``processes * 1000 / service_ms``. The prediction is the lowest of these bounds, and names
it: where throughput stops, and why. :func:`project` applies the same costs to more
machines (docs/scaling.md prints its table).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.profile import DRIVER, CpuSnapshot
from bench.saga_e2e import Bench
from saga.examples.order_saga.cluster import SAGA_SERVICES

PROCESS_COUNTS = (1, 2, 4)
#: Where the 4-process prediction must land (docs/scaling.md, issue 19's acceptance).
TOLERANCE = 0.25
_NUMBERED = re.compile(r"-\d+$")


@dataclass(frozen=True)
class Run:
    """What one run measured: throughput, and CPU milliseconds per saga by component."""

    processes: int
    sagas_per_s: float
    #: The machine's CPU per saga (every process, the servers, the kernel), less the driver's.
    machine_ms: float
    cores: float
    busy_share: float
    #: ms per saga: each service's consumers together, its relay, PostgreSQL, RabbitMQ...
    component_ms: dict[str, float]
    #: Deliveries handled per saga, by service (its inbox rows).
    steps: dict[str, float]
    #: Consumer transactions (batches) per saga, every service together.
    transactions: float

    @property
    def broker_ms_per_message(self) -> float:
        return self.component_ms.get("RabbitMQ", 0.0) / max(sum(self.steps.values()), 1e-9)

    @property
    def postgres_ms_per_step(self) -> float:
        return self.component_ms.get("PostgreSQL", 0.0) / max(sum(self.steps.values()), 1e-9)


def component(process: str) -> str:
    """A process's component: ``orders-3`` (a third orders consumer) counts as ``orders``."""
    return process if "relay" in process else _NUMBERED.sub("", process)


def measure(processes: int, sagas: int, paced_at: float | None = None) -> Run:
    """One run with ``processes`` consumer processes per service.

    At full load the orders are placed before the clock starts (``Bench.place_backlog``):
    one driver starting sagas while 16 consumers share two cores gets too little CPU to
    keep them fed, and the run would measure the driver. ``paced_at`` starts them at that
    many a second instead, with the clock running: a run at part load, where consumers
    find few deliveries waiting and commit small batches.
    """
    with tempfile.TemporaryDirectory() as work:
        bench = Bench(Path(work), processes=processes)
        try:
            bench.measure(300)  # warm up: connections, caches, JIT-less Python paths
            if paced_at is None:
                bench.place_backlog(sagas)
            steps_before = _steps(bench)
            before = CpuSnapshot(bench)
            if paced_at is None:
                measured = bench.release_backlog()
            else:
                measured = bench.measure(sagas, rate=paced_at)
            after = CpuSnapshot(bench)
            steps_after = _steps(bench)
        finally:
            bench.close()
    elapsed = sagas / measured.sagas_per_s
    spent = after.by_component - before.by_component
    by_kind: dict[str, float] = {}
    for name, seconds in spent.items():
        by_kind[component(name)] = by_kind.get(component(name), 0.0) + 1000 * seconds / sagas
    busy = after.busy - before.busy
    return Run(
        processes=processes,
        sagas_per_s=round(measured.sagas_per_s, 1),
        machine_ms=1000 * busy / sagas - by_kind.get(DRIVER, 0.0),
        cores=(after.total - before.total) / elapsed,
        busy_share=busy / (after.total - before.total),
        component_ms=by_kind,
        steps={s: (steps_after[s] - steps_before[s]) / sagas for s in SAGA_SERVICES},
        transactions=measured.transactions / sagas,
    )


def _steps(bench: Bench) -> dict[str, int]:
    counts = {}
    for service in SAGA_SERVICES:
        with bench.system.connect(service) as conn:
            row = conn.execute("SELECT count(*) FROM saga.inbox").fetchone()
        counts[service] = int(row[0]) if row else 0
    return counts


@dataclass(frozen=True)
class CostLine:
    """CPU milliseconds per saga: a fixed part plus a part per consumer transaction."""

    fixed_ms: float
    per_transaction_ms: float

    @classmethod
    def through(cls, large: tuple[float, float], small: tuple[float, float]) -> CostLine:
        """The line through two (transactions per saga, ms per saga) points: one from
        large batches, one from small."""
        (t_large, ms_large), (t_small, ms_small) = large, small
        if t_small - t_large < 0.1:
            raise ValueError(
                f"the calibration runs committed {t_large:.2f} and {t_small:.2f} consumer "
                "transactions per saga: too close to tell a transaction's cost from a saga's"
            )
        per_transaction = (ms_small - ms_large) / (t_small - t_large)
        return cls(ms_large - per_transaction * t_large, per_transaction)

    def at(self, transactions: float) -> float:
        return self.fixed_ms + self.per_transaction_ms * transactions


@dataclass(frozen=True)
class CostModel:
    """A saga's CPU as a function of how many consumer transactions carry it.

    Calibrated from two 1-process runs: full load, where consumers commit large batches,
    and part load, where they commit small ones. A run with more processes commits smaller
    batches than the 1-process run at full load (each consumer takes a share of every
    burst); the model takes that run's transactions per saga and prices them at the
    1-process costs.
    """

    machine: CostLine
    services: dict[str, CostLine]

    @classmethod
    def fit(cls, large: Run, small: Run) -> CostModel:
        if large.processes != 1 or small.processes != 1:
            raise ValueError("the cost model is calibrated from 1-process runs")

        def line(large_ms: float, small_ms: float) -> CostLine:
            return CostLine.through((large.transactions, large_ms), (small.transactions, small_ms))

        return cls(
            line(large.machine_ms, small.machine_ms),
            {s: line(large.component_ms[s], small.component_ms[s]) for s in SAGA_SERVICES},
        )

    def bounds(self, processes: int, cores: float, transactions: float) -> dict[str, float]:
        """Sagas/s each resource of this machine carries at most, at ``transactions``
        consumer transactions per saga."""
        found = {"the machine's CPU": cores * 1000 / self.machine.at(transactions)}
        for service, cost in self.services.items():
            found[f"{service} consumers' Python (one core each)"] = (
                processes * 1000 / cost.at(transactions)
            )
        return found

    def predict(self, run: Run) -> tuple[float, str]:
        """The predicted sagas/s of ``run``'s deployment, and the bound that sets it."""
        found = self.bounds(run.processes, run.cores, run.transactions)
        limit = min(found, key=lambda name: found[name])
        return found[limit], limit


@dataclass(frozen=True)
class Deployment:
    """Machines to project onto: hosts running the consumers and relays, one PostgreSQL
    per service, a RabbitMQ cluster."""

    hosts: int
    cores_per_host: int = 2
    postgres_cores: int = 8
    broker_nodes: int = 3
    cores_per_broker_node: int = 4
    #: CPU of a replicated (quorum) message against a classic one, across the cluster.
    replication_factor: float = 1.0


def project(costs: Run, where: Deployment) -> dict[str, float]:
    """Sagas/s each tier of ``where`` carries at most, from one run's per-core costs.

    Python: every saga's consumer and relay CPU spread over every host's cores. PostgreSQL:
    each service's database does its own steps (the orchestrator's ``orders`` the most),
    at this run's PostgreSQL CPU per step. The broker: every message on the cluster's cores;
    and one queue is one Erlang process (one core) on its leader node, so the busiest
    queue, orders' (every reply), caps the whole saga.
    """
    python_ms = sum(
        ms for name, ms in costs.component_ms.items() if name.split("-")[0] in SAGA_SERVICES
    )
    found = {"consumers and relays (Python)": where.hosts * where.cores_per_host * 1000 / python_ms}
    for service, steps in costs.steps.items():
        per_saga = costs.postgres_ms_per_step * steps
        found[f"PostgreSQL of {service}"] = where.postgres_cores * 1000 / per_saga
    message_ms = costs.broker_ms_per_message * where.replication_factor
    messages = sum(costs.steps.values())
    broker_cores = where.broker_nodes * where.cores_per_broker_node
    found["RabbitMQ cluster"] = broker_cores * 1000 / (message_ms * messages)
    found["the orders queue (one core)"] = 1000 / (message_ms * costs.steps["orders"])
    return found


def figures_and_rows(
    runs: list[Run], part_load: Run
) -> tuple[dict[str, float], list[tuple[str, str, str]]]:
    """What the report shows: each run, the model's prediction for it, the 4-process check.

    ``runs`` are the full-load runs, 1 process first; ``part_load`` is the 1-process run
    at part load that, with the first, calibrates the model.
    """
    model = CostModel.fit(runs[0], part_load)
    # Another run on a shared machine inflates every cost: the report says how loaded it was.
    figures: dict[str, float] = {
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        "scaling_model_fixed_ms_per_saga": round(model.machine.fixed_ms, 2),
        "scaling_model_ms_per_transaction": round(model.machine.per_transaction_ms, 2),
        "scaling_part_load_sagas_per_s": part_load.sagas_per_s,
        "scaling_part_load_machine_ms_per_saga": round(part_load.machine_ms, 2),
        "scaling_part_load_transactions_per_saga": round(part_load.transactions, 3),
    }
    rows: list[tuple[str, str, str]] = []
    for run in runs:
        predicted, limit = model.predict(run)
        error = (predicted - run.sagas_per_s) / run.sagas_per_s
        n = run.processes
        figures |= {
            f"scaling_{n}_sagas_per_s": run.sagas_per_s,
            f"scaling_{n}_predicted_sagas_per_s": round(predicted, 1),
            f"scaling_{n}_prediction_error": round(error, 3),
            f"scaling_{n}_machine_ms_per_saga": round(run.machine_ms, 2),
            f"scaling_{n}_transactions_per_saga": round(run.transactions, 3),
            f"scaling_{n}_busy_share": round(run.busy_share, 3),
        }
        for name, ms in sorted(run.component_ms.items()):
            key = re.sub(r"\W+", "_", name.lower()).strip("_")
            figures[f"scaling_{n}_cpu_ms_{key}"] = round(ms, 3)
        rows.append(
            (
                f"{n} consumer process(es) per service",
                f"{run.sagas_per_s:,.0f} sagas/s",
                f"model {predicted:,.0f} ({error:+.0%}), bound by {limit}; "
                f"{run.transactions:.2f} consumer transactions per saga; machine "
                f"{run.busy_share:.0%} busy, {run.machine_ms:.1f} ms CPU per saga",
            )
        )
    rows.append(
        (
            "1 process at part load (calibration)",
            f"{part_load.sagas_per_s:,.0f} sagas/s",
            f"{part_load.transactions:.2f} consumer transactions per saga, "
            f"{part_load.machine_ms:.1f} ms CPU per saga",
        )
    )
    rows.append(
        (
            "model: the machine's CPU per saga",
            f"{model.machine.fixed_ms:.2f} ms + {model.machine.per_transaction_ms:.2f} ms "
            "per consumer transaction",
            "fitted through the two 1-process runs",
        )
    )
    base = runs[0]
    for name, ms in sorted(base.component_ms.items(), key=lambda item: -item[1]):
        rows.append((f"1-process cost: {name}", f"{ms:.2f} ms CPU per saga", ""))
    rows.append(
        (
            "1-process cost: per message",
            f"PostgreSQL {base.postgres_ms_per_step:.3f} ms per step",
            f"RabbitMQ {base.broker_ms_per_message:.3f} ms per message, "
            f"{sum(base.steps.values()):.1f} steps per saga",
        )
    )
    last = figures[f"scaling_{runs[-1].processes}_prediction_error"]
    figures["scaling_prediction_within_tolerance"] = float(abs(last) <= TOLERANCE)
    return figures, rows
