"""The workload driver as a process of its own (chaos runs): submits orders over time.

    python -m tests.rig.submitter --database-url URL --orders 600 --seconds 120

Each order starts a saga keyed by its order id, so a driver killed halfway
and started again submits everything again without creating a saga twice.
"""

from __future__ import annotations

import argparse
import sys
import time

import psycopg

from saga.db.connections import DIRECT, POOLED_POLLING
from saga.examples.order_saga import workload
from saga.examples.order_saga.orders import create_order


def _already_started(conn: psycopg.Connection[tuple[str]]) -> set[str]:
    rows = conn.execute("SELECT idempotency_key FROM saga.saga_instances").fetchall()
    return {row[0] for row in rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="the orders service's database")
    parser.add_argument("--orders", type=int, default=600)
    parser.add_argument("--seconds", type=float, default=120.0, help="spread submissions over this")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--prefix", default="chaos")
    parser.add_argument(
        "--behind-pooler",
        action="store_true",
        help="the database URL goes through a transaction pooler (no prepared statements)",
    )
    parser.add_argument(
        "--outage-seconds",
        type=float,
        default=120.0,
        help="give up when the database stays unavailable this long",
    )
    args = parser.parse_args(argv)
    access = POOLED_POLLING if args.behind_pooler else DIRECT
    orders = workload.make_orders(
        args.orders, workload.FailureRates(), seed=args.seed, prefix=args.prefix
    )
    pause = args.seconds / max(len(orders), 1)
    submitted = 0
    outage_since: float | None = None
    while submitted < len(orders):
        try:
            # autocommit: each order commits on its own (an implicit transaction around the
            # whole loop would hold every order until the end, and lose them on a restart)
            with access.connect(args.database_url, connect_timeout=5, autocommit=True) as conn:
                outage_since = None
                done = _already_started(conn)  # a restarted driver picks up where it was
                while submitted < len(orders):
                    order = orders[submitted]
                    if order.order_id not in done:
                        with conn.transaction():
                            create_order.start(conn, order, idempotency_key=order.order_id)
                        time.sleep(pause)
                    submitted += 1
        except psycopg.OperationalError as exc:  # the database restarted: carry on after it
            now = time.monotonic()
            outage_since = now if outage_since is None else outage_since
            if now - outage_since > args.outage_seconds:
                print(
                    f"driver: database unavailable for {args.outage_seconds:.0f}s "
                    f"({type(exc).__name__}); giving up after {submitted} orders",
                    flush=True,
                )
                return 1
            print(f"driver: database unavailable ({type(exc).__name__}); retrying", flush=True)
            time.sleep(0.5)  # the next connection attempt, within the deadline above
    print(f"driver: submitted {submitted} orders", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
