"""The PostgreSQL broker at full load for minutes: do dead tuples stay flat, and does
throughput hold while a snapshot is held?

``python -m bench.pg_broker_soak [--seconds 600] [--every 15] [--hold START END]``

A publisher thread inserts batches of 100 as fast as the consumer keeps up (at most
:data:`BACKLOG` messages waiting), one consumer takes and acknowledges them, and every
``--every`` seconds a sample of the messages table is read from ``pg_stat_user_tables``:
live and dead tuples, vacuums (the consumers' own and autovacuum's), the table's size on
disk. Every message lives for milliseconds; what the run shows is whether vacuuming keeps
up, so the dead tuples and the size stay flat instead of growing with the messages that
went through. The series goes to ``bench/results/pg-broker-soak-<date>.json`` (and
``-latest.json``).

``--hold START END``: from START to END seconds into the run, another session holds a
snapshot on the database (``BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1``, then
idle), as a report or a forgotten psql window does; vacuum reclaims nothing meanwhile.
Each window then says whether the snapshot was held, the messages per second in it, and
the table's and its indexes' sizes; the summary divides each held window's rate by the
mean rate before the hold, and says how soon after the release a window is back to
0.95 of it. That run goes to ``pg-broker-held-snapshot-<date>.json`` (and ``-latest``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from kombu import Consumer, Producer
from kombu.message import Message

from bench.environment import ScratchDatabase
from saga.broker.transport import BrokerConfig, Topology

RESULTS = Path(__file__).resolve().parent / "results"
#: The publisher waits while this many messages are published and not yet consumed.
BACKLOG = 5_000
BATCH = 100

#: The messages table is the union of its generations' partitions: their sums.
_SAMPLE = """
SELECT sum(n_live_tup)::bigint, sum(n_dead_tup)::bigint,
       sum(autovacuum_count + vacuum_count)::bigint, sum(pg_total_relation_size(relid))::bigint,
       sum(pg_relation_size(relid))::bigint, sum(pg_indexes_size(relid))::bigint
FROM pg_stat_user_tables WHERE schemaname = 'saga_broker' AND relname LIKE 'messages\\_%'
"""


class Soak:
    def __init__(self, url: str) -> None:
        self.config = BrokerConfig(url)
        self.url = url
        self.queue = Topology(queue_prefix=f"soak{uuid.uuid4().hex[:8]}.").queue("soak")
        self.published = 0
        self.received = 0
        self.stop = threading.Event()

    def publish(self) -> None:
        body = json.dumps({"payload": "x" * 200})
        with self.config.connect() as conn:
            producer = Producer(conn.channel())
            while not self.stop.is_set():
                if self.published - self.received >= BACKLOG:
                    self.stop.wait(0.01)
                    continue
                with producer.batch(max_size=BATCH):
                    for _ in range(BATCH):
                        producer.publish(body, exchange="", routing_key=self.queue.name)
                self.published += BATCH

    def consume(self) -> None:
        def on_message(message: Message) -> None:
            self.received += 1
            message.ack()

        with self.config.connect() as conn:
            channel = conn.channel()
            Consumer(channel, [self.queue], on_message=on_message, prefetch_count=BATCH).consume()
            while not self.stop.is_set():
                try:
                    conn.drain_events(timeout=0.5)
                except TimeoutError:
                    continue

    def sample(self, started: float, held: bool) -> dict[str, Any]:
        with psycopg.connect(self.url, autocommit=True) as db:
            row = db.execute(_SAMPLE).fetchone()
        live, dead, vacuums, size, table, indexes = row if row else (0, 0, 0, 0, 0, 0)
        return {
            "t_s": round(time.monotonic() - started, 1),
            "consumed": self.received,
            "held": held,
            "live": live,
            "dead": dead,
            "vacuums": vacuums,
            "bytes": size,
            "table_bytes": table,
            "index_bytes": indexes,
        }

    def run(
        self, seconds: float, every: float, hold: tuple[float, float] | None = None
    ) -> list[dict[str, Any]]:
        threads = [threading.Thread(target=self.publish), threading.Thread(target=self.consume)]
        for thread in threads:
            thread.start()
        started = time.monotonic()
        series: list[dict[str, Any]] = []
        holder: psycopg.Connection[Any] | None = None
        try:
            while (now := time.monotonic() - started) < seconds:
                if hold and holder is None and hold[0] <= now < hold[1]:
                    holder = psycopg.connect(self.url, application_name="soak-held-snapshot")
                    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    holder.execute("SELECT 1")
                elif hold and holder is not None and now >= hold[1]:
                    holder.close()
                    holder = None
                self.stop.wait(every)
                series.append(self.sample(started, holder is not None))
                last = series[-2] if len(series) > 1 else {"t_s": 0, "consumed": 0}
                elapsed = (series[-1]["t_s"] - last["t_s"]) or 1
                series[-1]["msg_per_s"] = round((self.received - last["consumed"]) / elapsed)
                print(json.dumps(series[-1]), flush=True)
        finally:
            self.stop.set()
            if holder is not None:
                holder.close()
            for thread in threads:
                thread.join()
        return series


def summary(series: list[dict[str, Any]]) -> dict[str, Any]:
    """Dead tuples and size in the first and the last third of the run, and the rate."""
    third = max(1, len(series) // 3)
    first, last = series[:third], series[-third:]
    seconds = series[-1]["t_s"] or 1
    return {
        "seconds": seconds,
        "messages": series[-1]["consumed"],
        "msg_per_s": round(series[-1]["consumed"] / seconds),
        "dead_median_first_third": statistics.median(s["dead"] for s in first),
        "dead_median_last_third": statistics.median(s["dead"] for s in last),
        "dead_max_first_third": max(s["dead"] for s in first),
        "dead_max_last_third": max(s["dead"] for s in last),
        "bytes_max_first_third": max(s["bytes"] for s in first),
        "bytes_max_last_third": max(s["bytes"] for s in last),
        "vacuums": series[-1]["vacuums"],
    }


def held_summary(series: list[dict[str, Any]], every: float) -> dict[str, Any]:
    """Each held window's rate over the mean rate before the hold; the sizes at the end of
    the hold; seconds from the release to the first window back at 0.95 of that rate."""
    held = [n for n, s in enumerate(series) if s["held"]]
    if not held:
        return {}
    before = [s["msg_per_s"] for s in series[: held[0]]]
    free = statistics.mean(before) if before else 0
    after = series[held[-1] + 1 :]
    back = next((s for s in after if free and s["msg_per_s"] >= 0.95 * free), None)
    ratios = [round(series[n]["msg_per_s"] / free, 3) if free else None for n in held]
    end = series[held[-1]]
    return {
        "free_msg_per_s": round(free),
        "held_ratio_per_window": ratios,
        "held_ratio_min": min((r for r in ratios if r is not None), default=None),
        "held_seconds": round(end["t_s"] - series[held[0]]["t_s"] + every),
        "bytes_at_hold_end": end["bytes"],
        "table_bytes_at_hold_end": end["table_bytes"],
        "index_bytes_at_hold_end": end["index_bytes"],
        "dead_at_hold_end": end["dead"],
        "after_release_msg_per_s": [s["msg_per_s"] for s in after],
        "recovered_within_s": round(back["t_s"] - end["t_s"]) if back else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--every", type=float, default=15)
    parser.add_argument(
        "--hold",
        type=float,
        nargs=2,
        metavar=("START", "END"),
        help="hold a snapshot from START to END seconds into the run",
    )
    args = parser.parse_args()
    result = run(args.seconds, args.every, tuple(args.hold) if args.hold else None)
    print(json.dumps(result["summary"], indent=2))
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    kind = "pg-broker-held-snapshot" if args.hold else "pg-broker-soak"
    for name in (f"{kind}-{stamp}.json", f"{kind}-latest.json"):
        (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")


def run(seconds: float, every: float, hold: tuple[float, float] | None) -> dict[str, Any]:
    """One soak on a scratch database: its summary, and the series of samples."""
    database = ScratchDatabase.create(f"bench_{uuid.uuid4().hex[:6]}_soak", framework=False)
    try:
        series = Soak(database.url).run(seconds, every, hold)
    finally:
        database.drop()
    return {
        "summary": summary(series) | held_summary(series, every),
        "series": series,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


if __name__ == "__main__":
    main()
