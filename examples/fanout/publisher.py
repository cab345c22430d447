"""A publisher of the fan-out run: events ``--first`` to ``--last``, in transactions of
``--batch``, each one recorded in ``published`` in the transaction that publishes it.

Killed and started again, it goes on after the last event it committed: every number is
published once, whatever happens to the process.

    python -m saga.examples.fanout.publisher --database-url URL --first 1 --last 5000
"""

from __future__ import annotations

import argparse
import sys
import time

import psycopg

from saga import Outbox
from saga.examples.fanout.services import Tick


def publish(url: str, first: int, last: int, batch: int, rate: float | None) -> int:
    """Publish what is left of ``first``..``last``; return how many this call published."""
    outbox = Outbox()
    began, done = time.monotonic(), 0
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            with conn.transaction():
                row = conn.execute(
                    "SELECT coalesce(max(n), %s - 1) FROM published WHERE n BETWEEN %s AND %s",
                    (first, first, last),
                ).fetchone()
                start = int(row[0]) + 1 if row else first
                numbers = list(range(start, min(start + batch, last + 1)))
                if not numbers:
                    return done
                conn.execute("INSERT INTO published SELECT unnest(%s::int[])", (numbers,))
                for n in numbers:
                    outbox.publish(conn, Tick(n=n))
            done += len(numbers)
            if rate:
                time.sleep(max(0.0, began + done / rate - time.monotonic()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--first", type=int, required=True)
    parser.add_argument("--last", type=int, required=True)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rate", type=float, default=None, help="events a second at most")
    args = parser.parse_args(argv)
    while True:
        try:
            published = publish(args.database_url, args.first, args.last, args.batch, args.rate)
        except psycopg.OperationalError as exc:  # the database restarted: go on after it
            print(f"publisher: database unavailable ({type(exc).__name__}); retrying", flush=True)
            time.sleep(0.5)
            continue
        print(f"publisher: published {published} events up to {args.last}", flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())
