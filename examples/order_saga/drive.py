"""The workload driver as a process of its own (chaos runs): submits orders over time.

    python -m examples.order_saga.drive --database-url URL --orders 600 --seconds 120

Each order starts a saga keyed by its order id, so a driver killed halfway
and started again submits everything again without creating a saga twice.
"""

from __future__ import annotations

import argparse
import sys
import time

import psycopg

from examples.order_saga import driver
from examples.order_saga.orders import create_order


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="the orders service's database")
    parser.add_argument("--orders", type=int, default=600)
    parser.add_argument("--seconds", type=float, default=120.0, help="spread submissions over this")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--prefix", default="chaos")
    args = parser.parse_args(argv)
    orders = driver.make_orders(
        args.orders, driver.FailureRates(), seed=args.seed, prefix=args.prefix
    )
    pause = args.seconds / max(len(orders), 1)
    submitted = 0
    while submitted < len(orders):
        try:
            with psycopg.connect(args.database_url, connect_timeout=5) as conn:
                while submitted < len(orders):
                    order = orders[submitted]
                    with conn.transaction():
                        create_order.start(conn, order, idempotency_key=order.order_id)
                    submitted += 1
                    time.sleep(pause)
        except psycopg.OperationalError as exc:  # the database restarted: carry on after it
            print(f"driver: database unavailable ({type(exc).__name__}); retrying", flush=True)
            time.sleep(0.5)
    print(f"driver: submitted {submitted} orders", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
