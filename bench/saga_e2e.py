"""The example order saga end to end: its four services, four relays, all separate processes
(the services subscribing to orders' events are left out: their own row is bench/events.py).

Full load: orders submitted as fast as one driver can start them (50 per
transaction); sagas/s from the first submit to the last saga finished, and
step transactions/s (deliveries handled and committed, counted from every
inbox). Latency: from the commit of a message's outbox row to the commit of the
consumer's transaction that handled it, read from every consumer's
``saga_delivery_latency_seconds`` histogram. A consumer that publishes its rows
right after committing stamps the commit time on them; for rows a relay
published (the saga starts, written by the driver) the clock starts earlier, at
the message's creation, which overstates their latency. Half load: the same, with orders
paced at half the full-load rate.

End to end (:func:`end_to_end`): sagas started one per transaction at a steady pace, each
saga's ``finished_at - started_at`` read from the orders database, p50/p99: at about one
saga a second (idle) and at half the full-load rate.
"""

from __future__ import annotations

import statistics
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import psycopg

from bench.environment import AMQP_URL, ScratchDatabase
from saga import Saga
from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import SAGA_SERVICES, TARGETS, Cluster
from saga.examples.order_saga.orders import OrderData, create_order
from tests.rig.supervisor import Supervisor

FIRST_PORT = 9460
LATENCY = "saga_delivery_latency_seconds"
BATCH_SIZE = "saga_consumer_batch_size"


@dataclass
class Measurement:
    sagas_per_s: float
    steps_per_s: float
    latency_ms: dict[str, float]
    #: Mean deliveries committed per consumer transaction, by service.
    batch_mean: dict[str, float]
    #: Consumer transactions (batches) committed, every consumer together.
    transactions: float


@dataclass
class EndToEnd:
    """Sagas started one per transaction at a steady pace: each one's duration."""

    rate: float
    sagas: int
    #: ``finished_at - started_at`` of each saga, in milliseconds: p50, p99.
    duration_ms: dict[str, float]
    measurement: Measurement
    #: The order-id prefix of the sagas measured (:meth:`Bench.step_durations_ms`).
    batch: str


def end_to_end(
    bench: Bench, rate: float, sagas: int, saga: Saga[OrderData] = create_order
) -> EndToEnd:
    """Start ``sagas`` one per transaction at ``rate`` a second on ``bench`` (whichever
    system it runs) and read each one's ``finished_at - started_at`` from its database.
    ``saga`` is the version of the order saga they start on (``create_order_v1`` reserves
    stock and credit one after the other, the default reserves them at once)."""
    measured = bench.measure(sagas, rate=rate, saga=saga)
    return _read(bench, bench.last_batch, rate, sagas, measured)


def end_to_end_alternating(
    bench: Bench, rate: float, sagas: int, first: Saga[OrderData], second: Saga[OrderData]
) -> tuple[EndToEnd, EndToEnd]:
    """:func:`end_to_end` for two versions at once: ``sagas`` of each, started one per
    transaction at ``rate`` a second in all, alternating (first, second, first, ...).
    Whatever the machine does meanwhile (a neighbour's burst, autovacuum, a slower
    minute) falls on both versions alike, so their ratio compares like with like; two
    runs one after the other drift apart by more than the difference being measured."""
    batches = [bench.new_batch(sagas, saga) for saga in (first, second)]
    measured = bench.measure_alternating(batches, rate, (first, second))
    (first_prefix, _), (second_prefix, _) = batches
    return (
        _read(bench, first_prefix, rate / 2, sagas, measured),
        _read(bench, second_prefix, rate / 2, sagas, measured),
    )


def _read(bench: Bench, batch: str, rate: float, sagas: int, measured: Measurement) -> EndToEnd:
    """The end-to-end figures of the ``sagas`` of ``batch``, started ``rate`` a second."""
    durations = bench.durations_ms(batch)
    if len(durations) != sagas:
        raise RuntimeError(f"{len(durations)} sagas of batch {batch} found, {sagas} started")
    return EndToEnd(rate, sagas, _exact_percentiles(durations), measured, batch)


class Bench:
    """A running example system on scratch databases, to measure repeatedly."""

    def __init__(
        self,
        work_dir: Path,
        orchestrator_concurrency: int = 1,
        orchestrators: int = 1,
        *,
        log_statements: bool = False,
        processes: int = 1,
    ) -> None:
        self.run_id = uuid.uuid4().hex[:6]
        self.databases = {  # migrated by Cluster.prepare
            s: ScratchDatabase.create(
                f"bench_{self.run_id}_{s}", framework=False, log_statements=log_statements
            )
            for s in SAGA_SERVICES
        }
        self.system = Cluster(
            {s: d.url for s, d in self.databases.items()},
            AMQP_URL,
            queue_prefix=f"bench{self.run_id}.",
        )
        self.system.prepare()
        # ``processes`` consumer processes per service (``orchestrators`` for orders if more)
        consumers = [
            (s if i == 0 else f"{s}-{i + 1}", s)
            for s in SAGA_SERVICES
            for i in range(max(processes, orchestrators) if s == "orders" else processes)
        ]
        self.ports = {name: FIRST_PORT + i for i, (name, _) in enumerate(consumers)}
        commands = [self.system.gateway_command()]
        for service in SAGA_SERVICES:
            commands.append((f"{service}-relay", ["relay"], self.system.env(service)))
        for name, service in consumers:
            consumer = [
                "consume", TARGETS[service], "--metrics-port", str(self.ports[name]),
                "--concurrency", str(orchestrator_concurrency if service == "orders" else 1),
            ]  # fmt: skip
            commands.append((name, consumer, self.system.env(service)))
        self.supervisor = Supervisor(commands, work_dir)
        self.submitted = 0
        #: The order-id prefix of the last batch started.
        self.last_batch = ""
        self._backlog = 0
        try:
            self._wait_for_metrics()
        except BaseException:  # the caller gets no Bench to close: leave nothing running
            self.close()
            raise

    def close(self) -> None:
        self.supervisor.stop()
        for database in self.databases.values():
            database.drop()
        self.system.delete_queues()

    def _wait_for_metrics(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self._scrape_all()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("consumers did not start serving metrics")

    # -- measuring ------------------------------------------------------------

    def measure(
        self, orders: int, rate: float | None = None, saga: Saga[OrderData] = create_order
    ) -> Measurement:
        """Submit ``orders`` (paced at ``rate`` per second if given) on ``saga`` and wait for
        all of them."""
        batch = self._new_orders(orders, saga)
        if rate is None:
            submit = partial(workload.submit, self.system, batch, per_transaction=50, saga=saga)
            return self._timed(orders, submit)
        return self._timed(orders, partial(self._paced, batch, rate, saga))

    def new_batch(self, orders: int, saga: Saga[OrderData]) -> tuple[str, list[OrderData]]:
        """``orders`` new orders for ``saga`` and the order-id prefix they share."""
        batch = self._new_orders(orders, saga)
        return self.last_batch, batch

    def measure_alternating(
        self,
        batches: list[tuple[str, list[OrderData]]],
        rate: float,
        sagas: tuple[Saga[OrderData], ...],
    ) -> Measurement:
        """Start the orders of ``batches`` (one batch per saga of ``sagas``) one per
        transaction, ``rate`` a second in all, taking one of each batch in turn; wait for
        all of them."""
        turns = [
            (order, saga)
            for orders in zip(*(batch for _, batch in batches), strict=True)
            for order, saga in zip(orders, sagas, strict=True)
        ]

        def submit() -> None:
            started = time.monotonic()
            with self.system.connect("orders") as conn:
                for i, (order, saga) in enumerate(turns):
                    time.sleep(max(0.0, started + i / rate - time.monotonic()))
                    with conn.transaction():
                        saga.start(conn, order, idempotency_key=order.order_id)

        return self._timed(len(turns), submit)

    def place_backlog(self, orders: int) -> None:
        """Start ``orders`` sagas with the orders relay stopped: their first commands wait
        in the outbox, as if every order had been placed at the same instant."""
        batch = self._new_orders(orders)
        self.supervisor.pause("orders-relay")
        try:
            workload.submit(self.system, batch, per_transaction=50)
        except BaseException:
            self.supervisor.resume("orders-relay")
            raise
        self._backlog = orders

    def release_backlog(self) -> Measurement:
        """Let the relay publish the placed backlog and wait for every saga of it: sagas/s
        from the release to the last saga finished, with no driver competing for the CPU."""
        orders, self._backlog = self._backlog, 0
        if not orders:
            raise RuntimeError("no backlog placed: call place_backlog first")
        return self._timed(orders, partial(self.supervisor.resume, "orders-relay"))

    def durations_ms(self, batch: str) -> list[float]:
        """``finished_at - started_at`` in milliseconds of every finished saga of ``batch``."""
        with self.system.connect("orders") as conn:
            rows = conn.execute(
                "SELECT extract(epoch FROM finished_at - started_at) * 1000 "
                "FROM saga.saga_instances "
                "WHERE data->>'order_id' LIKE %s || '-%%' AND finished_at IS NOT NULL",
                (batch,),
            ).fetchall()
        return [float(row[0]) for row in rows]

    def step_durations_ms(self, batch: str, steps: tuple[str, ...]) -> list[float]:
        """How long each saga of ``batch`` spent in ``steps`` (the step log's ``started_at``
        of the first to ``finished_at`` of the last: one step, or the members of a parallel
        group), in milliseconds, one figure per saga that went through all of them."""
        with self.system.connect("orders") as conn:
            rows = conn.execute(
                "SELECT extract(epoch FROM max(s.finished_at) - min(s.started_at)) * 1000 "
                "FROM saga.saga_steps s JOIN saga.saga_instances i ON i.id = s.saga_id "
                "WHERE i.data->>'order_id' LIKE %s || '-%%' AND s.step = ANY(%s) "
                "AND s.phase = 'forward' AND s.outcome = 'succeeded' "
                "GROUP BY s.saga_id HAVING count(DISTINCT s.step) = %s",
                (batch, list(steps), len(steps)),
            ).fetchall()
        if not rows:
            raise RuntimeError(f"no saga of batch {batch} went through {', '.join(steps)}")
        return [float(row[0]) for row in rows]

    def _new_orders(self, orders: int, saga: Saga[OrderData] = create_order) -> list[OrderData]:
        self.last_batch = f"b{self.submitted}"
        batch = workload.make_orders(
            orders,
            workload.FailureRates(0, 0, 0, 0),
            seed=self.submitted,
            prefix=self.last_batch,
            max_lines=workload.lines_taken(saga),
        )
        self.submitted += orders
        return batch

    def _timed(self, orders: int, submit: Callable[[], object]) -> Measurement:
        """Run ``submit`` (it starts ``orders`` sagas, or lets them go) and wait for all of
        them: their figures, from the consumers' metrics before and after."""
        before, before_steps = self._scrape_all(), self._steps()
        started = time.monotonic()
        submit()
        self._wait_finished(self.submitted, timeout=600)
        elapsed = time.monotonic() - started
        after, steps = self._scrape_all(), self._steps() - before_steps
        hist_before, hist_after = _histogram(before), _histogram(after)
        delta = {le: hist_after[le] - hist_before.get(le, 0) for le in hist_after}
        batch_mean = {name: _batch_mean(before[name], after[name]) for name in self.ports}
        transactions = sum(
            _total(after[name], f"{BATCH_SIZE}_count") - _total(before[name], f"{BATCH_SIZE}_count")
            for name in self.ports
        )
        return Measurement(
            orders / elapsed, steps / elapsed, _percentiles(delta), batch_mean, transactions
        )

    def settle(self, timeout: float = 120.0) -> None:
        """Let the server finish what the runs before left it (a checkpoint, autovacuum of
        the tables they filled), so that an idle measurement does not take that for the
        framework's cost; gives up waiting after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self.system.connect("orders", autocommit=True) as conn:
            conn.execute("CHECKPOINT")
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
                ).fetchone()
                if not row or row[0] == 0:
                    return
                time.sleep(0.5)

    def consumer_rss_mb(self, service: str = "orders") -> float:
        pid = self.supervisor.processes[service].proc.pid
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def preload_history(self, rows: int) -> None:
        """Fill every inbox and the orders step log with ``rows`` old rows each (growth test)."""
        for service, database in self.databases.items():
            with psycopg.connect(database.url, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO saga.inbox (consumer, message_id, received_at) "
                    "SELECT 'history', lpad(to_hex(i), 32, '0')::uuid, now() - interval '1 day' "
                    "FROM generate_series(1, %s) AS i",
                    (rows,),
                )
                if service == "orders":
                    conn.execute(
                        "INSERT INTO saga.saga_steps (saga_id, step, phase, attempt, outcome, "
                        "started_at, finished_at) SELECT lpad(to_hex(i / 6), 32, '0')::uuid, "
                        "'history', 'forward', 1, 'succeeded', now() - interval '1 day', "
                        "now() - interval '1 day' FROM generate_series(1, %s) AS i",
                        (rows,),
                    )
                conn.execute("VACUUM ANALYZE saga.inbox")
                conn.execute("VACUUM ANALYZE saga.saga_steps")

    # -- helpers ----------------------------------------------------------------

    def _paced(self, batch: list[OrderData], rate: float, saga: Saga[OrderData]) -> None:
        """Start the orders one per transaction on ``saga``, ``rate`` a second."""
        started, sent = time.monotonic(), 0

        def pace(count: int) -> None:
            nonlocal sent
            sent += count
            time.sleep(max(0.0, started + sent / rate - time.monotonic()))

        workload.submit(self.system, batch, on_progress=pace, per_transaction=1, saga=saga)

    def _wait_finished(self, total: int, timeout: float) -> None:
        wait_until_finished(self.system.database_urls["orders"], timeout)
        counts = workload.status_counts(self.system)
        if counts.get("completed", 0) + counts.get("compensated", 0) < total:
            raise RuntimeError(f"sagas finished, but not all completed or compensated: {counts}")

    def _steps(self) -> int:
        total = 0
        for service in SAGA_SERVICES:
            with self.system.connect(service) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM saga.inbox WHERE consumer <> 'history'"
                ).fetchone()
            total += int(row[0]) if row else 0
        return total

    def _scrape_all(self) -> dict[str, list[str]]:
        """Every consumer's metrics, by consumer process."""
        return {name: _scrape(port) for name, port in self.ports.items()}


def wait_until_finished(database_url: str, timeout: float) -> None:
    """Poll (on one connection: polling must stay cheap) until no saga is unfinished."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(database_url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM saga.saga_instances WHERE finished_at IS NULL"
            ).fetchone()
            unfinished = row[0] if row else 0
            if unfinished == 0:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{unfinished} sagas still unfinished after {timeout}s")
            time.sleep(0.1)


def _scrape(port: int) -> list[str]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    return [line for line in text.decode().splitlines() if not line.startswith("#")]


def _histogram(scraped: dict[str, list[str]]) -> Counter[float]:
    """Cumulative latency bucket counts summed over every consumer."""
    merged: Counter[float] = Counter()
    for lines in scraped.values():
        for line in lines:
            if line.startswith(f"{LATENCY}_bucket"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                merged[float("inf") if le == "+Inf" else float(le)] += float(line.rsplit(" ", 1)[1])
    return merged


def _batch_mean(before: list[str], after: list[str]) -> float:
    """Mean deliveries per transaction of one consumer between two scrapes."""
    deliveries, batches = (
        _total(after, f"{BATCH_SIZE}_{part}") - _total(before, f"{BATCH_SIZE}_{part}")
        for part in ("sum", "count")
    )
    return round(deliveries / max(1, batches), 1)


def _total(lines: list[str], name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name))


def _percentiles(cumulative: dict[float, float]) -> dict[str, float]:
    """p50/p95/p99 in milliseconds, interpolated inside histogram buckets."""
    bounds = sorted(cumulative)
    total = cumulative[bounds[-1]] if bounds else 0
    result = {}
    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        target, lower, below = q * total, 0.0, 0.0
        value = float("nan")
        for bound in bounds:
            count = cumulative[bound]
            if count >= target and total:
                upper = bound if bound != float("inf") else lower * 2
                share = (target - below) / (count - below) if count > below else 1.0
                value = (lower + (upper - lower) * share) * 1000
                break
            lower, below = bound, count
        result[name] = round(value, 2)
    return result


def _exact_percentiles(values: list[float]) -> dict[str, float]:
    """p50/p99 of raw values (interpolated between the nearest two)."""
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(cuts[49], 2), "p99": round(cuts[98], 2)}
