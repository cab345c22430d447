"""Events to three subscribers against commands to one service, in the same run.

``python -m bench.events [--messages 20000] [--broker rabbitmq|postgres] [--save]``

Each side has a publisher database and a relay on it (``saga relay``), and its consumers
as ``saga consume`` processes, each on a database of its own: for commands one service
(``bench._events_app:commands``), for events the fan-out example's three subscribers
(``saga.examples.fanout.services``). With every process connected, ``--messages``
outbox rows are written in one transaction (commands to the one service, or events
with no destination); the clock starts at its commit and stops when every consumer's
database holds every message. Commands/s is messages over that time; events/s too, and
deliveries/s is three times it (every event is handled once by each subscriber). The
commands run first, then the events, on the same servers.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory

import psycopg

from bench.environment import AMQP_URL, ScratchDatabase, machine
from bench.report import RESULTS
from saga import Outbox
from saga.broker.transport import Topology
from saga.examples.fanout.services import SCHEMA, SUBSCRIBERS, Tick
from saga.examples.order_saga.cluster import delete_queues
from saga.examples.order_saga.processes import SagaProcess, saga_env
from saga.messaging.outbox import OutgoingMessage


def _fill(url: str, count: int, destination: str | None) -> float:
    """Write ``count`` messages in one transaction; return when it committed."""
    outbox = Outbox()
    messages = [OutgoingMessage(outbox.envelope(Tick(n=n)), destination) for n in range(count)]
    with psycopg.connect(url) as conn:
        for start in range(0, count, 5_000):
            outbox.add_many(conn, messages[start : start + 5_000])
        conn.commit()
    return time.monotonic()


def _handled(urls: list[str]) -> int:
    """The fewest messages any of the consumers' databases holds."""
    counts = []
    for url in urls:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM effects").fetchone()
            counts.append(int(row[0]) if row else 0)
    return min(counts)


def _side(
    broker_url: str, count: int, consumers: list[str], destination: str | None, logs: Path
) -> float:
    """Messages per second of one side: ``consumers`` (module:service targets), each on
    its own scratch database, fed through one relay."""
    run_id = uuid.uuid4().hex[:6]
    topology = Topology(queue_prefix=f"bench{run_id}.")
    publisher = ScratchDatabase.create(f"bench_{run_id}_publisher")
    databases = [ScratchDatabase.create(f"bench_{run_id}_consumer") for _ in consumers]
    names = [target.rsplit(":", 1)[1] for target in consumers]
    processes: list[SagaProcess] = []
    try:
        for database in databases:
            with psycopg.connect(database.url) as conn:
                conn.execute(SCHEMA.encode())
        for target, name, database in zip(consumers, names, databases, strict=True):
            env = saga_env(database.url, broker_url, topology.queue_prefix)
            processes.append(SagaProcess(["consume", target], env, logs, f"{run_id}-{name}"))
        env = saga_env(publisher.url, broker_url, topology.queue_prefix)
        processes.append(SagaProcess(["relay"], env, logs, f"{run_id}-relay"))
        for process in processes:
            process.wait_for_output("consuming" if "consume" in process.args else "connected", 60)
        committed = _fill(publisher.url, count, destination)
        urls = [d.url for d in databases]
        deadline = committed + 600
        while _handled(urls) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"not every message arrived within 600 s ({_handled(urls)})")
            time.sleep(0.05)
        return count / (time.monotonic() - committed)
    finally:
        for process in processes:
            process.terminate(60)
        for database in [publisher, *databases]:
            database.drop()
        delete_queues(broker_url, topology.queue_prefix, names)


def measure(count: int, broker: str = "rabbitmq") -> dict[str, float]:
    """Commands/s to one service, then events/s to three subscribers, on ``broker``."""
    broker_db = (
        ScratchDatabase.create("bench_events_broker", framework=False)
        if (broker == "postgres")
        else None
    )
    broker_url = broker_db.url if broker_db is not None else AMQP_URL
    try:
        with TemporaryDirectory() as logs:
            commands = _side(
                broker_url, count, ["bench._events_app:commands"], "commands", Path(logs)
            )
            targets = [f"saga.examples.fanout.services:{name}" for name in SUBSCRIBERS]
            events = _side(broker_url, count, targets, None, Path(logs))
    finally:
        if broker_db is not None:
            broker_db.drop()
    return {
        "messages": count,
        "commands_per_s": round(commands, 1),
        "events_per_s": round(events, 1),
        "event_deliveries_per_s": round(events * len(SUBSCRIBERS), 1),
        "deliveries_vs_commands": round(events * len(SUBSCRIBERS) / commands, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--broker", choices=("rabbitmq", "postgres"), default="rabbitmq")
    parser.add_argument("--save", action="store_true", help="write bench/results/events-*.json")
    args = parser.parse_args()
    figures = measure(args.messages, args.broker)
    print(json.dumps(figures))
    if args.save:
        document = {**figures, "broker": args.broker, "machine": machine()}
        for tag in (time.strftime("%Y-%m-%d"), "latest"):
            path = RESULTS / f"events-{args.broker}-{tag}.json"
            path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
