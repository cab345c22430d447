"""The chaos run (``make chaos``): the example under injected faults, then the checker.

The example's services (the order saga's four, and notifications and analytics, which
subscribe to the events orders publishes), their relays (two for the orders database)
and a workload driver run as separate processes on PostgreSQL and RabbitMQ. While orders
flow, a fault schedule SIGKILLs random processes (a supervisor restarts them), pauses
one with SIGSTOP past the broker heartbeat, restarts RabbitMQ, restarts PostgreSQL (fast
shutdown), leaves a transaction idle that starts a saga and commits late, and takes the
payment gateway's charges down for longer than the payments service retries (the first
charge of each outage is made and its answer lost). Held charges become dead letters; as
an operator would once the gateway is back, the run replays them. Then it waits for
quiescence and runs the checker (the gateway's money included).

``--broker redis`` runs the order saga's four services alone (Redis carries commands,
not events) on a private ``redis-server`` (its own port, persistence ``appendonly yes``
/ ``appendfsync always``) that the deck crashes and starts again (``restart_redis``)
instead of restarting RabbitMQ and PostgreSQL: nothing may be lost, with no operator
action. ``--broker redis-volatile`` runs on one without persistence: first the relay
must refuse it, then the run accepts the risk (``SAGA_ACCEPT_REDIS_MESSAGE_LOSS``), each
restart loses what Redis held, and once no saga has moved for :data:`STUCK_AFTER_S`
seconds after the faults, ONE bulk ``saga resume --stuck-after`` must bring every
stranded saga to its end, each effect applied once. The shared PostgreSQL and RabbitMQ
are never restarted in these modes.

``--broker postgres`` runs on the framework's PostgreSQL transport, its messages in a
database of their own (``chaos_<run>_broker``). Every database of the run, the broker's
and the services', lives on a private PostgreSQL (its own cluster and port, see
:mod:`tests.rig.postgres_server`) that the deck crashes (immediate shutdown)
and starts again (``restart_private_postgres``); the shared servers are never restarted.
The deck also kills and pauses processes (a consumer killed holding a batch: its messages
come back when the lease of :data:`POSTGRES_LEASE_S` seconds ends), leaves transactions
idle and takes the gateway down. Nothing may be lost or handled twice, with no operator
action but the replay.

``--broker rabbitmq-cluster`` runs on a private three-node RabbitMQ cluster (see
:mod:`tests.rig.rabbitmq_cluster`) with quorum queues, every process given
the three nodes' URLs. The deck SIGKILLs one node and starts it again
(``kill_rabbitmq_node``, twice a deck, a different node each time: the others keep the
quorum, and the clients fail over to them) besides killing and pausing processes,
leaving transactions idle and taking the gateway down. The shared servers are never
restarted. Nothing may be lost or handled twice, with no operator action but the replay,
and the stuck-saga sweep is off: every saga must end through its own messages, every
event reach every subscriber. A run in which any saga was resumed automatically (a
process given ``SAGA_RESUME_STUCK_AFTER``) fails, listing each.

``--runs N`` runs N times in a row (seeds ``--seed``, ``--seed`` + 1, ...), each run's
lines as above, then one summary line (the soak)::

    soak: runs=N failed=N sagas=N node_kills=N lost=N duplicated=N unconverged=N resumed=N

``--pgbouncer`` puts every database URL of the services, the relays, the driver and a
PostgreSQL broker through a private PgBouncer in transaction mode (see
:mod:`tests.rig.pgbouncer_server`) in front of the run's PostgreSQL: the
processes run with ``SAGA_POOLER=transaction`` and ``SAGA_WAKEUPS=poll``, and PostgreSQL
restarts behind the pooler. ``--processes N`` runs N relays and N consumers per service
(as if on N hosts): per-saga order and exactly-once must hold across them.

The last line is machine-readable::

    chaos: sagas=N faults=N lost=N duplicated=N unconverged=N converge_s=X
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from saga.db.connections import DIRECT, POOLED_POLLING
from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import SERVICES, Cluster
from saga.examples.order_saga.gateway import GatewayClient
from saga.examples.order_saga.processes import SAGA
from tests.rig.checker import check
from tests.rig.fault_injector import (
    BROKER_URL,
    RABBITMQ_PORT,
    FaultInjector,
    wait_port,
)
from tests.rig.operator import BulkResume, replay_held
from tests.rig.private_servers import PrivateServers
from tests.rig.redis_server import RedisServer
from tests.rig.stuck_sagas import automatic_resumes, describe_stuck
from tests.rig.supervisor import Supervisor

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
KINDS = (
    "kill",
    "pause",
    "restart_rabbitmq",
    "restart_postgres",
    "idle_transaction",
    "gateway_outage",
)
#: The faults of a Redis run: the private Redis restarts, the shared servers never do.
REDIS_KINDS = ("kill", "pause", "restart_redis", "idle_transaction", "gateway_outage")
#: The faults of a PostgreSQL-broker run: the private PostgreSQL restarts, the shared never.
POSTGRES_KINDS = ("kill", "pause", "restart_private_postgres", "idle_transaction", "gateway_outage")
#: The faults of a run on a private RabbitMQ cluster: a node killed (twice a deck).
RABBITMQ_CLUSTER_KINDS = (
    "kill",
    "pause",
    "kill_rabbitmq_node",
    "kill_rabbitmq_node",
    "idle_transaction",
    "gateway_outage",
)
BROKERS = ("rabbitmq", "rabbitmq-cluster", "redis", "redis-volatile", "postgres")
#: PostgreSQL-broker runs: a message taken by a killed consumer comes back this soon (seconds).
POSTGRES_LEASE_S = 10
#: Redis runs: a message taken by a killed consumer comes back this soon (seconds).
REDIS_VISIBILITY_TIMEOUT_S = 10
#: The payments service's delayed retries during a run: an outage outlasts them all.
PAYMENTS_RETRY_DELAYS = "0.5,1"


def _wait_for_gateway(system: Cluster, seconds: float = 120) -> None:
    """Until the payment gateway answers (many processes start at once on a small box)."""
    gateway = GatewayClient(system.gateway_url)
    deadline = time.monotonic() + seconds
    while True:
        try:
            gateway.state()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the payment gateway is not up after {seconds}s") from None
            time.sleep(0.2)


def kinds_of(broker: str) -> tuple[str, ...]:
    """The kinds of fault a run on ``broker`` injects."""
    if broker == "rabbitmq":
        return KINDS
    if broker == "rabbitmq-cluster":
        return RABBITMQ_CLUSTER_KINDS
    return POSTGRES_KINDS if broker == "postgres" else REDIS_KINDS


def _deck(rng: random.Random, kinds: tuple[str, ...]) -> list[str]:
    deck = ["kill"] * 6 + list(kinds[1:])  # kills are the commonest fault
    rng.shuffle(deck)
    return deck


def _broker_env(broker: str, redis: RedisServer | None) -> dict[str, str]:
    if broker == "postgres":
        return {"SAGA_BROKER_LEASE": str(POSTGRES_LEASE_S)}
    if redis is None:
        return {}
    env = {"SAGA_REDIS_VISIBILITY_TIMEOUT": str(REDIS_VISIBILITY_TIMEOUT_S)}
    if not redis.persistent:
        env["SAGA_ACCEPT_REDIS_MESSAGE_LOSS"] = "true"
    return env


def refused_without_consent(system: Cluster) -> bool:
    """A relay started on a volatile Redis without accepting the risk exits at once, saying why."""
    env = {**os.environ, **system.env("orders")}
    env.pop("SAGA_ACCEPT_REDIS_MESSAGE_LOSS", None)
    done = subprocess.run(
        [SAGA, "relay"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    return done.returncode == 2 and "--accept-redis-message-loss" in done.stderr


def _broker_database(broker: str, run_id: str) -> str | None:
    """The database of a PostgreSQL-broker run's messages (None on the other brokers)."""
    return f"chaos_{run_id}_broker" if broker == "postgres" else None


def _cluster(
    names: dict[str, str],
    run_id: str,
    heartbeat: int,
    broker: str,
    servers: PrivateServers,
    processes: int,
) -> Cluster:
    """The run's databases (created and migrated) and the services' settings."""
    broker_db = _broker_database(broker, run_id)
    for name in [*names.values(), *([broker_db] if broker_db else [])]:
        servers.admin("CREATE DATABASE {}", name)
    broker_url = BROKER_URL
    if servers.redis is not None:
        broker_url = servers.redis.url
    elif servers.rabbitmq is not None:
        broker_url = servers.rabbitmq.url
    elif broker_db is not None:
        broker_url = servers.service_url(broker_db)
    system = Cluster(
        {s: servers.service_url(n) for s, n in names.items()},
        broker_url,
        queue_prefix=f"chaos{run_id}.",
        queue_type="quorum" if servers.rabbitmq is not None else "classic",
        processes=processes,
        access=POOLED_POLLING if servers.pgbouncer else DIRECT,
        extra_env={
            "SAGA_BROKER_HEARTBEAT": str(heartbeat),
            "ORDER_SAGA_FLAKINESS": "0.02",
            "SAGA_SIDE_EFFECT_LEASE": "2",
            "PAYMENTS_RETRY_DELAYS": PAYMENTS_RETRY_DELAYS,
            **_broker_env(broker, servers.redis),
        },
    )
    system.prepare()
    return system


def _commands(
    system: Cluster, sagas: int, duration: float, seed: int, run_id: str
) -> list[tuple[str, list[str], dict[str, str]]]:
    """Every process of the run: the cluster's, a second orders relay, the driver."""
    commands = system.commands()
    if system.processes == 1:  # orders has two relays in any case
        commands.append(("orders-relay-2", ["relay"], system.env("orders")))
    commands.append(
        (
            "driver",
            [sys.executable, "-m", "tests.rig.submitter", "--database-url",
             system.database_urls["orders"], "--orders", str(sagas), "--seconds",
             str(duration * 0.8), "--seed", str(seed), "--prefix", f"c{run_id}",
             *(["--behind-pooler"] if system.access.pooled else [])],
            {},
        )
    )  # fmt: skip
    return commands


def run(
    sagas: int,
    duration: float,
    interval: float,
    heartbeat: int,
    seed: int,
    keep: bool,
    broker: str = "rabbitmq",
    *,
    pgbouncer: bool = False,
    processes: int = 1,
) -> dict[str, Any]:
    rng = random.Random(seed)
    run_id = uuid.uuid4().hex[:6]
    servers = PrivateServers.start(broker, pgbouncer=pgbouncer)
    try:
        return _run(
            sagas, duration, interval, heartbeat, keep, rng, run_id, broker, servers, seed,
            processes,
        )  # fmt: skip
    finally:
        servers.close()


def _run(
    sagas: int,
    duration: float,
    interval: float,
    heartbeat: int,
    keep: bool,
    rng: random.Random,
    run_id: str,
    broker: str,
    servers: PrivateServers,
    seed: int,
    processes: int,
) -> dict[str, Any]:
    names = {s: f"chaos_{run_id}_{s}" for s in SERVICES}
    system = _cluster(names, run_id, heartbeat, broker, servers, processes)
    redis = servers.redis
    refused = refused_without_consent(system) if redis and not redis.persistent else None
    logs = RESULTS.parent / "chaos-logs" / run_id
    commands = _commands(system, sagas, duration, seed, run_id)
    supervisor = Supervisor(commands, logs)
    _wait_for_gateway(system)  # its outages are faults: it must be up before the first
    injector = FaultInjector(supervisor, system, heartbeat, rng, servers)
    kinds = kinds_of(broker)
    print(
        f"chaos {run_id} on {broker}{' through PgBouncer' if servers.pgbouncer else ''}, "
        f"{processes} process(es) per service: {sagas} sagas over {duration:.0f}s, "
        f"a fault every {interval}s; logs in {logs}"
    )
    try:
        wait_port(system.gateway_port, 120)  # a loaded box starts it slowly
        _inject_faults(supervisor, injector, rng, kinds, duration, interval)
        injector.settle()
        wait_port(servers.postgres_port, 60)
        if broker == "rabbitmq":
            wait_port(RABBITMQ_PORT, 60)
        faults_end = time.monotonic()
        expected = sagas + len(injector.late_orders)
        resumer = BulkResume(system) if redis is not None and not redis.persistent else None
        converged = _quiesce(system, supervisor, expected, max(120.0, duration), resumer)
        converge_s = time.monotonic() - faults_end
        gateway = GatewayClient(system.gateway_url).state()
    finally:
        codes = supervisor.stop()
    report = check(system, gateway)
    counts = workload.status_counts(system)
    present = sum(counts.values())
    unconverged = counts.get("running", 0) + counts.get("compensating", 0)
    lost = report.figures.get("commands_lost", 0) + max(0, expected - present)
    result = {
        "broker": broker,
        "pgbouncer": servers.pgbouncer is not None,
        "processes_per_service": processes,
        "sagas": present,
        "expected_sagas": expected,
        "faults": sum(injector.done.values()),
        "faults_by_kind": dict(injector.done),
        "process_restarts": sum(supervisor.restarts.values()),
        "lost": lost,
        "duplicated": report.figures.get("effects_duplicated", 0),
        "unconverged": unconverged if converged else max(unconverged, 1),
        "converge_s": round(converge_s, 1),
        "violations": report.violations,
        "figures": report.figures,
        "exit_codes": codes,
        "stuck": describe_stuck(system) if unconverged else [],
        "resumed_automatically": automatic_resumes(logs),
    }
    result.update(_redis_figures(refused, resumer))
    if not keep:
        shutil.rmtree(logs, ignore_errors=True)
        system.delete_queues()
        broker_db = _broker_database(broker, run_id)
        for name in [*names.values(), *([broker_db] if broker_db else [])]:
            servers.admin("DROP DATABASE IF EXISTS {} WITH (FORCE)", name)
    return result


def _inject_faults(
    supervisor: Supervisor,
    injector: FaultInjector,
    rng: random.Random,
    kinds: tuple[str, ...],
    duration: float,
    interval: float,
) -> None:
    """One fault every ``interval`` seconds for ``duration`` seconds, drawn from a deck, and
    on until every kind has been injected once (faults that take long, such as restarts,
    can leave a short run short of a whole deck), but never past four times ``duration``."""
    started = time.monotonic()
    deck: list[str] = []
    injected: set[str] = set()

    def going_on() -> bool:
        elapsed = time.monotonic() - started
        return elapsed < duration or (elapsed < 4 * duration and not injected >= set(kinds))

    while going_on():
        time.sleep(interval)
        supervisor.watch()
        deck = deck or _deck(rng, kinds)
        kind = deck.pop()
        if not injector.ready(kind):
            deck.insert(0, kind)  # later in the deck
            continue
        try:
            injector.inject(kind)
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            print(f"chaos: fault {kind} could not be injected: {exc}")
            raise
        print(f"  t={time.monotonic() - started:5.1f}s fault {kind}", flush=True)
        injected.add(kind)


def _redis_figures(refused: bool | None, resumer: BulkResume | None) -> dict[str, Any]:
    """What a volatile Redis run adds: the refusal without consent, the one bulk resume."""
    figures: dict[str, Any] = {}
    if refused is not None:
        figures["refused_without_consent"] = refused
    if resumer is not None:
        figures["bulk_resumes"] = resumer.runs
        figures["sagas_resumed"] = resumer.resumed
    return figures


def _quiesce(
    system: Cluster,
    supervisor: Supervisor,
    expected: int,
    timeout: float,
    resumer: BulkResume | None = None,
) -> bool:
    """Wait until every saga finished, replaying held charges the way an operator would
    (and, after a volatile Redis lost messages, resuming the stranded sagas once)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        supervisor.watch()
        try:
            replay_held(system)
            if workload.quiescent(system, expected):
                return True
            if resumer is not None:
                resumer.once_all_stuck()
        except psycopg.OperationalError:
            pass
        time.sleep(0.5)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sagas", type=int, default=600)
    parser.add_argument("--duration", type=float, default=150.0, help="seconds of faults")
    parser.add_argument("--interval", type=float, default=2.5, help="seconds between faults")
    parser.add_argument("--heartbeat", type=int, default=4, help="broker heartbeat (seconds)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--runs", type=int, default=1, help="runs in a row (a soak), seeds counting up from --seed"
    )
    parser.add_argument("--keep", action="store_true", help="keep the databases and logs")
    parser.add_argument("--save", action="store_true", help="write bench/results/chaos-*.json")
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        default="rabbitmq",
        help="rabbitmq (restarts the local RabbitMQ and PostgreSQL), rabbitmq-cluster (a "
        "private three-node RabbitMQ cluster with quorum queues, its nodes killed by the run), "
        "a private redis-server with persistence (redis) or without (redis-volatile), "
        "restarted by the run, or postgres (the PostgreSQL transport on a private PostgreSQL, "
        "restarted by the run)",
    )
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="every database URL through a private PgBouncer in transaction mode",
    )
    parser.add_argument(
        "--processes", type=int, default=1, help="relay and consumer processes per service"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, not {args.runs}")
    tools = {
        "rabbitmq": ("rabbitmqctl", "pg_ctlcluster"),
        "rabbitmq-cluster": ("rabbitmqctl",),
        "postgres": (),
    }.get(args.broker, ("redis-server",))
    for tool in tools:
        if shutil.which(tool) is None:
            print(f"chaos needs {tool} (a server it may restart)")
            return 2
    results = []
    for seed in range(args.seed, args.seed + args.runs):
        result = run(
            args.sagas,
            args.duration,
            args.interval,
            args.heartbeat,
            seed,
            args.keep,
            args.broker,
            pgbouncer=args.pgbouncer,
            processes=args.processes,
        )
        result["seed"] = seed
        result["ok"] = _report(result, args.broker)
        results.append(result)
        if args.save:
            _save(_prefix(args), result)
    if args.runs > 1:
        soak = _soak(results)
        if args.save:
            _save(_prefix(args) + "-soak", soak)
        print("soak: " + " ".join(f"{key}={soak[key]}" for key in SOAK_FIGURES))
    return 0 if all(result["ok"] for result in results) else 1


def _report(result: dict[str, Any], broker: str) -> bool:
    """Print one run's figures, ending with its machine-readable line; True if it passed."""
    print(f"faults injected: {result['faults']} {result['faults_by_kind']}")
    print(f"process restarts: {result['process_restarts']}")
    print(f"sagas: {result['sagas']} of {result['expected_sagas']}")
    for key, value in sorted(result["figures"].items()):
        print(f"  {key}: {value}")
    for violation in result["violations"]:
        print(f"VIOLATION: {violation}")
    for line in result["stuck"]:
        print(line)
    for saga in result["resumed_automatically"]:
        print(f"resumed automatically (the sweep was meant to be off): saga {saga}")
    print(
        f"chaos: sagas={result['sagas']} faults={result['faults']} lost={result['lost']} "
        f"duplicated={result['duplicated']} unconverged={result['unconverged']} "
        f"converge_s={result['converge_s']}"
        + (f" resumed={result['sagas_resumed']}" if "sagas_resumed" in result else "")
        + f" resumed_automatically={len(result['resumed_automatically'])}"
    )
    missing_kinds = [k for k in kinds_of(broker) if not result["faults_by_kind"].get(k)]
    ok = not (
        result["lost"]
        or result["duplicated"]
        or result["unconverged"]
        or result["violations"]
        or result["resumed_automatically"]
    )
    if result.get("refused_without_consent") is False:
        print("chaos: the relay did not refuse the volatile Redis without consent")
        ok = False
    if missing_kinds:
        print(f"chaos: not every kind of fault was injected: missing {missing_kinds}")
    return ok and not missing_kinds


#: The figures of a soak's summary line, in order.
SOAK_FIGURES = (
    "runs", "failed", "sagas", "node_kills", "lost", "duplicated", "unconverged", "resumed",
)  # fmt: skip


def _soak(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of several runs in a row, summed, and each run's own."""
    return {
        "runs": len(results),
        "failed": sum(not r["ok"] for r in results),
        "sagas": sum(r["sagas"] for r in results),
        "node_kills": sum(r["faults_by_kind"].get("kill_rabbitmq_node", 0) for r in results),
        "lost": sum(r["lost"] for r in results),
        "duplicated": sum(r["duplicated"] for r in results),
        "unconverged": sum(r["unconverged"] for r in results),
        "resumed": sum(len(r["resumed_automatically"]) for r in results),
        "each": [{key: r[key] for key in RUN_FIGURES} for r in results],
    }


#: What a soak keeps of each of its runs.
RUN_FIGURES = (
    "seed", "ok", "sagas", "faults_by_kind", "lost", "duplicated", "unconverged", "converge_s",
)  # fmt: skip


def _prefix(args: argparse.Namespace) -> str:
    """The name of a run's result files: chaos[-broker][-pgbouncer][-xN]."""
    prefix = "chaos" if args.broker == "rabbitmq" else f"chaos-{args.broker}"
    prefix += "-pgbouncer" if args.pgbouncer else ""
    return prefix + (f"-x{args.processes}" if args.processes > 1 else "")


def _save(prefix: str, document: dict[str, Any]) -> None:
    """bench/results/<prefix>-<date>.json and <prefix>-latest.json."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    document = {**document, "measured_at": datetime.now(UTC).isoformat(timespec="seconds")}
    for name in (f"{prefix}-{stamp}.json", f"{prefix}-latest.json"):
        (RESULTS / name).write_text(json.dumps(document, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
