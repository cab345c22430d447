"""The PostgreSQL broker at full load for minutes: do dead tuples stay flat?

``python -m bench.pg_broker_soak [--seconds 600] [--every 15]``

A publisher thread inserts batches of 100 as fast as the consumer keeps up (at most
:data:`BACKLOG` messages waiting), one consumer takes and acknowledges them, and every
``--every`` seconds a sample of the messages table is read from ``pg_stat_user_tables``:
live and dead tuples, vacuums (the consumers' own and autovacuum's), the table's size on
disk. Every message lives for milliseconds; what the run shows is whether vacuuming keeps
up, so the dead tuples and the size stay flat instead of growing with the messages that
went through. The series goes to ``bench/results/pg-broker-soak-<date>.json`` (and
``-latest.json``).
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

_SAMPLE = """
SELECT n_live_tup, n_dead_tup, autovacuum_count + vacuum_count, pg_total_relation_size(relid)
FROM pg_stat_user_tables WHERE schemaname = 'saga_broker' AND relname = 'messages'
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

    def sample(self, started: float) -> dict[str, Any]:
        with psycopg.connect(self.url, autocommit=True) as db:
            row = db.execute(_SAMPLE).fetchone()
        live, dead, vacuums, size = row if row else (0, 0, 0, 0)
        return {
            "t_s": round(time.monotonic() - started),
            "consumed": self.received,
            "live": live,
            "dead": dead,
            "vacuums": vacuums,
            "bytes": size,
        }

    def run(self, seconds: float, every: float) -> list[dict[str, Any]]:
        threads = [threading.Thread(target=self.publish), threading.Thread(target=self.consume)]
        for thread in threads:
            thread.start()
        started = time.monotonic()
        series = []
        try:
            while time.monotonic() - started < seconds:
                self.stop.wait(every)
                series.append(self.sample(started))
                print(json.dumps(series[-1]), flush=True)
        finally:
            self.stop.set()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--every", type=float, default=15)
    args = parser.parse_args()
    database = ScratchDatabase.create(f"bench_{uuid.uuid4().hex[:6]}_soak", framework=False)
    try:
        series = Soak(database.url).run(args.seconds, args.every)
    finally:
        database.drop()
    result = {
        "summary": summary(series),
        "series": series,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    print(json.dumps(result["summary"], indent=2))
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    for name in (f"pg-broker-soak-{stamp}.json", "pg-broker-soak-latest.json"):
        (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
