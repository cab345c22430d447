"""The fan-out run: N events to three subscribers while processes die and the broker
restarts; then every subscriber's database must hold every event exactly once.

    python -m tests.rig.fanout --broker rabbitmq --events 10000 [--save]
    python -m tests.rig.fanout --broker postgres --events 10000 [--save]

``rabbitmq``: a private RabbitMQ node (its own name, ports and data folder: a cluster of
one, :mod:`tests.rig.rabbitmq_cluster`) that the run kills with SIGKILL
and starts again;
the databases are on the PostgreSQL of ``SAGA_FANOUT_DATABASE_URL`` (default: the local
one; ``run(database_url=...)``), which is never restarted. ``postgres``: the PostgreSQL
broker, its tables in a database of their own, and every database of the run on a
private PostgreSQL cluster (:mod:`tests.rig.postgres_server`) that the
run crashes (immediate shutdown) and starts again. The shared servers are never
restarted.

Every process is real: two publishers (:mod:`saga.examples.fanout.publisher`), two
``saga relay`` on the publishers' database, for each subscriber a ``saga consume`` and a
``saga relay`` on its database. The run has ``--duration`` / ``--interval`` fault slots,
one every ``--interval`` seconds: in each, one of them (never the broker) is killed with
SIGKILL and started again by the supervisor, except the middle slot, where the broker is
crashed and started again. The slots are counted, not timed, so a broker slow to come
back delays the later kills instead of dropping them. In its first life every process also carries
two crash points (:data:`FAULTS`): a relay dies between the broker's confirmation and the
delete of its rows, a subscriber between its commit and its acknowledgement, so copies
come twice and the inboxes must absorb them. The events go out paced over
``--duration`` seconds, so the faults fall while they flow.

The last line is machine-readable::

    fanout: broker=B events=N subscribers=3 lost=N duplicated=N kills=N broker_restarts=N seconds=X
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from saga.broker.transport import BrokerConfig, Topology, declare_subscriptions
from saga.db.schema import migrate
from saga.examples.fanout import services
from saga.examples.fanout.services import SCHEMA, SUBSCRIBERS
from tests.rig.postgres_server import PostgresServer
from tests.rig.rabbitmq_cluster import RabbitCluster
from tests.rig.supervisor import Supervisor

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
BROKERS = ("rabbitmq", "postgres")
PUBLISHERS = 2
#: Seconds before a message a killed PostgreSQL-broker consumer held comes back.
LEASE_S = 10
#: Crash points armed in every process's first life: a relay dies after the broker took a
#: batch and before its rows are deleted (the batch goes out again), a subscriber after
#: its commit and before its acknowledgement (the broker delivers again): duplicates that
#: every subscriber's inbox must absorb.
FAULTS = "relay.after_publish@4,consumer.after_commit@6"
DATABASE_URL = os.environ.get(
    "SAGA_FANOUT_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@dataclass
class Servers:
    """Where the run's databases and broker are; what it may crash (never shared servers)."""

    admin_url: str
    rabbitmq: RabbitCluster | None = None
    postgres: PostgresServer | None = None

    @classmethod
    def start(cls, broker: str, database_url: str) -> Servers:
        if broker == "rabbitmq":
            rabbitmq = RabbitCluster(size=1)
            rabbitmq.start()  # closes what it started if it fails
            return cls(database_url, rabbitmq=rabbitmq)
        postgres = PostgresServer()
        try:
            postgres.start()
        except BaseException:
            postgres.close()
            raise
        return cls(postgres.url, postgres=postgres)

    def url(self, database: str) -> str:
        return self.admin_url.rsplit("/", 1)[0] + "/" + database

    def admin(self, statement: str, database: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL(statement).format(sql.Identifier(database)))

    def restart_broker(self) -> None:
        """Crash the broker and start it again (the private RabbitMQ or PostgreSQL)."""
        if self.rabbitmq is not None:
            (node,) = self.rabbitmq.nodes
            self.rabbitmq.kill(node)
            self.rabbitmq.start_node(node)
        else:
            assert self.postgres is not None
            self.postgres.restart()

    def close(self) -> None:
        for server in (self.rabbitmq, self.postgres):
            if server is not None:
                server.close()


@dataclass
class Outcome:
    """What each subscriber's database holds, against the events published."""

    events: int
    published: int = 0
    per_subscriber: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        return sum(self.events - s["distinct"] for s in self.per_subscriber.values())

    @property
    def duplicated(self) -> int:
        return sum(s["rows"] - s["distinct"] for s in self.per_subscriber.values())

    @property
    def complete(self) -> bool:
        return self.published == self.events and all(
            s["distinct"] == self.events for s in self.per_subscriber.values()
        )


class Run:
    """One fan-out run: its databases, topology and processes."""

    def __init__(self, servers: Servers, broker: str, events: int, log_dir: Path) -> None:
        self.servers = servers
        self.events = events
        self.run_id = uuid.uuid4().hex[:6]
        self.databases = {
            name: f"fanout_{self.run_id}_{name}" for name in ("publisher", *SUBSCRIBERS)
        }
        self.broker_database = f"fanout_{self.run_id}_broker" if broker == "postgres" else None
        for database in [*self.databases.values(), *filter(None, [self.broker_database])]:
            servers.admin("CREATE DATABASE {}", database)
        self.urls = {name: servers.url(db) for name, db in self.databases.items()}
        if servers.rabbitmq is not None:
            self.broker_url = servers.rabbitmq.url
        else:
            assert self.broker_database is not None
            self.broker_url = servers.url(self.broker_database)
        self.topology = Topology(queue_prefix=f"fanout{self.run_id}.")
        self.log_dir = log_dir

    def prepare(self) -> None:
        """Migrate every database, create the tables, bind the subscribers' queues (before
        the first event: a subscriber receives what is published after its binding)."""
        for url in self.urls.values():
            with psycopg.connect(url) as conn:
                migrate(conn, "saga")
                conn.execute(SCHEMA.encode())
        with BrokerConfig(self.broker_url).connect() as conn:
            channel = conn.channel()
            for name in SUBSCRIBERS:
                self.topology.queue(name)(channel).declare()
                declare_subscriptions(channel, self.topology, name, [services.Tick.__name__])

    def env(self, service: str) -> dict[str, str]:
        return {
            "SAGA_DATABASE_URL": self.urls[service],
            "SAGA_BROKER_URL": self.broker_url,
            "SAGA_QUEUE_PREFIX": self.topology.queue_prefix,
            "SAGA_BROKER_HEARTBEAT": "4",
            "SAGA_BROKER_LEASE": str(LEASE_S),
            "PYTHONUNBUFFERED": "1",
        }

    def commands(self, rate: float) -> list[tuple[str, list[str], dict[str, str]]]:
        """(name, arguments, environment) of every process of the run."""
        per = -(-self.events // PUBLISHERS)
        result: list[tuple[str, list[str], dict[str, str]]] = []
        for i in range(PUBLISHERS):
            first, last = i * per + 1, min((i + 1) * per, self.events)
            publisher = [
                sys.executable, "-m", "saga.examples.fanout.publisher", "--database-url",
                self.urls["publisher"], "--first", str(first), "--last", str(last),
                "--rate", str(rate / PUBLISHERS),
            ]  # fmt: skip
            result.append((f"publisher-{i + 1}", publisher, {}))
        for i in range(2):
            result.append((f"publisher-relay-{i + 1}", ["relay"], self.env("publisher")))
        for name in SUBSCRIBERS:
            target = f"saga.examples.fanout.services:{name}"
            result.append((name, ["consume", target], self.env(name)))
            result.append((f"{name}-relay", ["relay"], self.env(name)))
        return result

    def outcome(self) -> Outcome:
        outcome = Outcome(self.events)
        with psycopg.connect(self.urls["publisher"]) as conn:
            outcome.published = _count(conn, "SELECT count(*) FROM published")
        for name in SUBSCRIBERS:
            with psycopg.connect(self.urls[name]) as conn:
                rows, distinct = conn.execute(
                    "SELECT count(*), count(DISTINCT n) FROM effects"
                ).fetchone() or (0, 0)
            outcome.per_subscriber[name] = {"rows": int(rows), "distinct": int(distinct)}
        return outcome

    def drop(self) -> None:
        for database in [*self.databases.values(), *filter(None, [self.broker_database])]:
            self.servers.admin("DROP DATABASE IF EXISTS {} WITH (FORCE)", database)


def _count(conn: psycopg.Connection[Any], query: str) -> int:
    row = conn.execute(query.encode()).fetchone()
    return int(row[0]) if row else 0


def run(
    broker: str,
    events: int,
    *,
    duration: float = 60.0,
    interval: float = 3.0,
    seed: int = 1,
    timeout: float = 600.0,
    log_dir: Path | None = None,
    keep: bool = False,
    database_url: str = DATABASE_URL,
) -> dict[str, Any]:
    """Run it; return the figures (``lost`` and ``duplicated`` must be 0). The processes'
    logs are removed after a run without loss or duplicate, unless ``keep``."""
    if broker not in BROKERS:
        raise ValueError(f"broker must be one of {BROKERS}")
    rng = random.Random(seed)
    servers = Servers.start(broker, database_url)
    try:
        logs = log_dir or RESULTS.parent / "fanout-logs" / uuid.uuid4().hex[:6]
        the_run = Run(servers, broker, events, logs)
        try:
            result = _run(the_run, broker, duration, interval, timeout, rng)
        finally:
            the_run.drop()
        if result["lost"] or result["duplicated"] or keep:
            result["logs"] = str(logs)
        else:
            shutil.rmtree(logs, ignore_errors=True)
        return result
    finally:
        servers.close()


def _run(
    the_run: Run, broker: str, duration: float, interval: float, timeout: float, rng: Any
) -> dict[str, Any]:
    the_run.prepare()
    commands = the_run.commands(the_run.events / duration)
    supervisor = Supervisor(commands, the_run.log_dir, faults=FAULTS)
    started = time.monotonic()
    slots = max(2, round(duration / interval))
    kills = restarts = 0
    try:
        for slot in range(slots):
            time.sleep(interval)
            supervisor.watch()
            if slot == slots // 2:
                the_run.servers.restart_broker()
                restarts += 1
                print(f"  t={time.monotonic() - started:5.1f}s broker restarted", flush=True)
                continue
            alive = sorted(n for n, p in supervisor.processes.items() if p.returncode is None)
            victim = rng.choice(alive)
            supervisor.kill(victim)
            kills += 1
            print(f"  t={time.monotonic() - started:5.1f}s killed {victim}", flush=True)
        outcome = _converge(the_run, supervisor, started + timeout)
        elapsed = time.monotonic() - started
    finally:
        codes = supervisor.stop()
    return {
        "broker": broker,
        "events": the_run.events,
        "subscribers": len(SUBSCRIBERS),
        "published": outcome.published,
        "per_subscriber": outcome.per_subscriber,
        "lost": outcome.lost,
        "duplicated": outcome.duplicated,
        "kills": kills,
        "broker_restarts": restarts,
        "process_restarts": sum(supervisor.restarts.values()),
        "fault_points_fired": dict(supervisor.fired()),
        "seconds": round(elapsed, 1),
        "exit_codes": codes,
    }


def _converge(the_run: Run, supervisor: Supervisor, deadline: float) -> Outcome:
    """Restart what dies until every subscriber has every event (or the deadline)."""
    while True:
        supervisor.watch()
        try:
            outcome = the_run.outcome()
        except psycopg.OperationalError:
            time.sleep(0.5)
            continue
        if outcome.complete or time.monotonic() > deadline:
            return outcome
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=BROKERS, default="rabbitmq")
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of publishing")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between kills")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--save", action="store_true", help="write bench/results/fanout-*.json")
    parser.add_argument("--keep", action="store_true", help="keep the processes' logs")
    args = parser.parse_args(argv)
    result = run(
        args.broker,
        args.events,
        duration=args.duration,
        interval=args.interval,
        seed=args.seed,
        keep=args.keep,
    )
    for name, figures in result["per_subscriber"].items():
        print(f"  {name}: {figures['rows']} rows, {figures['distinct']} distinct events")
    if args.save:
        stamped = {**result, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        for tag in (time.strftime("%Y-%m-%d"), "latest"):
            path = RESULTS / f"fanout-{args.broker}-{tag}.json"
            path.write_text(json.dumps(stamped, indent=2) + "\n")
    print(
        f"fanout: broker={result['broker']} events={result['events']} "
        f"subscribers={result['subscribers']} lost={result['lost']} "
        f"duplicated={result['duplicated']} kills={result['kills']} "
        f"broker_restarts={result['broker_restarts']} seconds={result['seconds']}"
    )
    return 0 if result["lost"] == 0 and result["duplicated"] == 0 else 1
