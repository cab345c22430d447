"""The ceiling for whole sagas: pgbench replaying exactly the SQL one saga issues, nothing else.

``bench.ceiling`` runs one step's transaction (three statements); a saga step costs more SQL
than that (the saga row read and written, the step log, the reply, the relay's claim and
delete, the consumer's inbox). This module measures what the framework issues today, so the
figure follows the engine as it changes; nothing here lists the statements by hand.

Capture. A small copy of the benchmarked system (``bench.three_step_saga`` or the order saga
of ``bench.saga_e2e``) starts on scratch databases created with ``log_statement = 'all'`` set
on those databases alone (no server restart, no global setting). After a few warm-up sagas,
one saga runs alone; the server log written meanwhile (``pg_current_logfile()``, or the
postmaster's standard error when ``logging_collector`` is off) holds every statement every
session ran, with its parameters. Statements are grouped into transactions per backend
(``BEGIN`` ... ``COMMIT``; a statement outside one is a transaction of its own). The saga's
transactions are those connected to it: one naming the saga id, then, transitively, one naming
a message id or an outbox row id seen in them. Idle polling (relays finding nothing, the
benchmark's own wait) names none and is left out. An ``AFTER INSERT`` trigger on each
capture database's outbox records which row id each message got, since the log does not
show ids a ``RETURNING`` clause handed back.

Script. Per database (per service), that database's share of the saga, in log order, as a
pgbench script: the same statements, the same ``BEGIN``/``SAVEPOINT``/``COMMIT``, with each
parameter an explicitly typed literal (types from ``PREPARE``) except: every UUID becomes
``md5(:saga || '/n')::uuid`` (the same UUID, the same expression; ``:saga`` is random per
replayed saga), an outbox row id becomes the id the replayed ``INSERT ... RETURNING id``
returned (``\\gset``), and the business keys the caller names (an order id must be new, an
account or customer is drawn as the benchmark draws it) become pgbench expressions.

Replay. Every service's script runs at once, each with as many clients as the system held
connections to that database during the capture, for the same number of sagas (sized by a
short probe to last about ``seconds``); sagas per second is that number over the time until
the last service finished. No Python, no broker: the saga cannot finish faster on this server
with this SQL and this many sessions.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg

from bench._saga_app import Run, three_steps
from bench.ceiling import PGBENCH
from bench.environment import ADMIN_URL, ScratchDatabase
from bench.pgbench_script import INT_ARRAY, UUID_PATTERN, Key, Transaction, script
from bench.saga_e2e import Bench, wait_until_finished
from bench.statement_log import log_window, parse
from bench.three_step_saga import ThreeStepBench
from bench.workload import ACCOUNTS
from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import COMMON_SKUS, RICH_CUSTOMERS
from saga.examples.order_saga.orders import create_order
from saga.examples.order_saga.workload import FailureRates

WARM_UP = 5
SETTLE_S = 1.0
PROBE_SAGAS_PER_CLIENT = 20
#: Clients over all databases, split evenly (max_connections is often 100, and shared).
CLIENTS = (16, 32, 48)

Sweep = dict[str, float]

OUTBOX_IDS = """
CREATE TABLE public.bench_outbox_ids (id bigint PRIMARY KEY, message_id uuid NOT NULL);
CREATE FUNCTION public.bench_outbox_ids() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.bench_outbox_ids VALUES (NEW.id, NEW.message_id);
    RETURN NULL;
END $$;
CREATE TRIGGER bench_outbox_ids AFTER INSERT ON saga.outbox
    FOR EACH ROW EXECUTE FUNCTION public.bench_outbox_ids();
"""
DROP_OUTBOX_IDS = """
DROP TRIGGER IF EXISTS bench_outbox_ids ON saga.outbox;
DROP FUNCTION IF EXISTS public.bench_outbox_ids();
DROP TABLE IF EXISTS public.bench_outbox_ids;
"""


@dataclass
class Part:
    """One database's share of the saga and how the system used it."""

    service: str
    url: str
    transactions: list[Transaction]
    clients: int
    script: str = ""


@dataclass
class Ceiling:
    parts: list[Part]
    #: Sagas per second by clients: the system's own sessions per database ("4+3"), then
    #: the same count on every database ("16 each").
    sweep: Sweep

    @property
    def sagas_per_s(self) -> float:
        return max(self.sweep.values())

    @property
    def statements(self) -> int:
        return sum(t.work for p in self.parts for t in p.transactions)

    @property
    def transactions(self) -> int:
        return sum(len(p.transactions) for p in self.parts)

    def breakdown(self) -> str:
        """``service: statements per transaction`` for every service, e.g. ``runs 5+4+4``."""
        return "; ".join(
            f"{p.service} {'+'.join(str(t.work) for t in p.transactions)}" for p in self.parts
        )

    def scripts(self) -> str:
        return "\n".join(
            f"-- {p.service}: {len(p.transactions)} transactions, {p.clients} clients\n{p.script}"
            for p in self.parts
        )


# -- capture -----------------------------------------------------------------------------


def install_outbox_ids(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(OUTBOX_IDS)


def outbox_ids(url: str) -> dict[int, str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT id, message_id::text FROM public.bench_outbox_ids").fetchall()
        conn.execute(DROP_OUTBOX_IDS)
    return {int(i): str(m) for i, m in rows}


def sagas_share(
    transactions: list[Transaction], saga_id: str, ids: dict[str, dict[int, str]]
) -> list[Transaction]:
    """The transactions connected to ``saga_id`` through the UUIDs and outbox ids they name."""
    tokens = {saga_id}
    chosen: list[Transaction] = []
    rest = list(transactions)
    grew = True
    while grew:
        grew = False
        for tx in list(rest):
            text = tx.text()
            row_ids = {
                str(i)
                for i, m in ids.get(tx.database, {}).items()
                if m in tokens and "outbox" in text
            }
            named = any(token in text for token in tokens)
            if not named and row_ids and _names_row_id(tx, row_ids):
                named = True
            if named:
                chosen.append(tx)
                rest.remove(tx)
                tokens |= set(UUID_PATTERN.findall(text))
                grew = True
    order = {id(tx): i for i, tx in enumerate(transactions)}
    return sorted(chosen, key=lambda tx: order[id(tx)])


def _names_row_id(tx: Transaction, row_ids: set[str]) -> bool:
    for statement in tx.statements:
        for value in statement.params:
            match = INT_ARRAY.match(value or "")
            if match and "outbox" in statement.sql and set(match[1].split(",")) & row_ids:
                return True
    return False


def connections(databases: list[ScratchDatabase]) -> dict[str, int]:
    """Sessions open on each database right now, this probe's own excluded."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname, count(*) FROM pg_stat_activity "
            "WHERE datname = ANY(%s) AND pid <> pg_backend_pid() GROUP BY datname",
            ([d.name for d in databases],),
        ).fetchall()
    return {str(name): int(n) for name, n in rows}


# -- replay ------------------------------------------------------------------------------


def _run(parts: list[Part], sagas: int, work_dir: Path) -> float:
    """Every part at once, each replaying ``sagas`` split over its clients; seconds taken."""
    processes = []
    began = time.monotonic()
    for part in parts:
        path = work_dir / f"{part.service}.sql"
        path.write_text(part.script)
        jobs = max(1, min(part.clients, os.cpu_count() or 1))
        command = [PGBENCH, "-n", "-M", "prepared", "-f", str(path), "-c", str(part.clients)]
        command += ["-j", str(jobs), "-t", str(-(-sagas // part.clients)), part.url]
        processes.append(
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    outputs = [p.communicate() for p in processes]
    elapsed = time.monotonic() - began
    for part, process, (out, err) in zip(parts, processes, outputs, strict=True):
        if process.returncode != 0:
            raise RuntimeError(f"pgbench on {part.service} failed: {(err or out).strip()[-500:]}")
    return elapsed


def _clear(parts: list[Part]) -> None:
    """Empty the outboxes: a relay's claim in one client can lock, so keep, another's row."""
    for part in parts:
        with psycopg.connect(part.url, autocommit=True) as conn:
            conn.execute("DELETE FROM saga.outbox")


def replay(parts: list[Part], seconds: float, counts: tuple[int, ...] = CLIENTS) -> Sweep:
    """Sagas per second by client count: every part's pgbench for the same sagas, lasting
    about ``seconds``; first with the system's own sessions per database, then with ``counts``
    clients split evenly over the databases (more clients share commits, as batches do)."""
    if not Path(PGBENCH).exists():
        raise RuntimeError(f"{PGBENCH} not found (Debian package postgresql-client)")
    sweep: Sweep = {}
    own = "+".join(str(p.clients) for p in parts)
    with tempfile.TemporaryDirectory() as tmp:
        for label, trial in [
            (own, parts),
            *(
                (f"{n // len(parts)} each", [replace(p, clients=n // len(parts)) for p in parts])
                for n in counts
            ),
        ]:
            _clear(trial)
            probe = PROBE_SAGAS_PER_CLIENT * max(p.clients for p in trial)
            sagas = max(probe, int(probe * seconds / _run(trial, probe, Path(tmp))))
            sweep[label] = sagas / _run(trial, sagas, Path(tmp))
    return sweep


# -- the two benchmarked sagas -----------------------------------------------------------


def measure(
    databases: dict[str, ScratchDatabase],
    home: str,
    start: Callable[[], uuid.UUID],
    stop: Callable[[], object],
    keys: list[Key],
    seconds: float,
) -> Ceiling:
    """Capture one saga started by ``start`` on a running system, stop it, replay the SQL."""
    home_url = databases[home].url
    for database in databases.values():
        install_outbox_ids(database.url)
    for _ in range(WARM_UP):
        start()
        wait_until_finished(home_url, timeout=60)
    time.sleep(SETTLE_S)
    with log_window(ADMIN_URL, [d.name for d in databases.values()]) as lines:
        sessions = connections(list(databases.values()))
        saga_id = str(start())
        wait_until_finished(home_url, timeout=60)
        time.sleep(SETTLE_S)  # the last outbox deletes after commit
    stop()  # the replay has the machine to itself
    ids = {}
    for database in databases.values():
        ids[database.name] = outbox_ids(database.url)
        database.reset_settings()
    share = sagas_share(parse(lines), saga_id, ids)
    parts = []
    for service, database in databases.items():
        mine = [tx for tx in share if tx.database == database.name]
        if mine:
            clients = sessions.get(database.name, 0) + (1 if service == home else 0)  # + driver
            part = Part(service, database.url, mine, max(1, clients))
            part.script = script(mine, keys, ids[database.name], database.url)
            parts.append(part)
    if not parts:
        raise RuntimeError(
            "the server log holds no statement of the captured saga "
            "(log_line_prefix must show the backend as [%p] and the database as user@%d)"
        )
    return Ceiling(parts, replay(parts, seconds))


def three_step(seconds: float = 5, orchestrators: int = 1) -> Ceiling:
    """The ceiling of ``bench.three_step_saga``: three account updates, drawn like the bench."""
    accounts = [1237, 4561, 7893]  # distinctive, so that the replay draws them afresh

    with tempfile.TemporaryDirectory() as logs:
        bench = ThreeStepBench(Path(logs), orchestrators=orchestrators, log_statements=True)
        try:

            def start() -> uuid.UUID:
                with psycopg.connect(bench.home.url) as conn, conn.transaction():
                    return three_steps.start(conn, Run(run=424242, accounts=accounts))

            databases = {"runs": bench.home, "steps": bench.steps}
            keys = [Key(str(a), f"random(1, {ACCOUNTS})") for a in accounts]
            return measure(databases, "runs", start, bench.supervisor.stop, keys, seconds)
        finally:
            bench.close()


def order(seconds: float = 5) -> Ceiling:
    """The ceiling of the order saga: a new order id each time, customer and SKU drawn."""
    with tempfile.TemporaryDirectory() as logs:
        bench = Bench(Path(logs), log_statements=True)
        try:
            started = 0

            def start() -> uuid.UUID:
                nonlocal started
                new = workload.make_orders(1, FailureRates(0, 0, 0, 0), prefix=f"sql{started}")[0]
                started += 1
                with bench.system.connect("orders") as conn, conn.transaction():
                    return create_order.start(conn, new, idempotency_key=new.order_id)

            # the captured order is the sixth (after WARM_UP), made like every other
            captured = workload.make_orders(1, FailureRates(0, 0, 0, 0), prefix=f"sql{WARM_UP}")[0]
            keys = [
                Key(captured.order_id, "random(1, 1000000000000000000)", "'o-' || :{var}::text"),
                Key(
                    captured.customer_id,
                    f"random(0, {len(RICH_CUSTOMERS) - 1})",
                    "'c-' || lpad(:{var}::text, 2, '0')",
                ),
                Key(
                    captured.sku,
                    f"random(0, {len(COMMON_SKUS) - 1})",
                    "'sku-' || lpad(:{var}::text, 2, '0')",
                ),
            ]
            return measure(bench.databases, "orders", start, bench.supervisor.stop, keys, seconds)
        finally:
            bench.close()


def main() -> None:
    for name, ceiling in (("three-step", three_step()), ("order", order())):
        print(
            f"{name}: {ceiling.sagas_per_s:,.0f} sagas/s, {ceiling.statements} statements "
            f"in {ceiling.transactions} transactions ({ceiling.breakdown()})"
        )
        print(ceiling.scripts())


if __name__ == "__main__":
    main()
