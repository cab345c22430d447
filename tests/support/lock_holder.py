"""A lock holder in a process of its own, to be paused with SIGSTOP by a test.

    python -m tests.support.lock_holder REDIS_URL DATABASE_URL LOCK_NAME LEASE

Prints its fencing token, waits for a line on stdin, then writes to the fenced
resource with that token and reports what happened, then whether it still holds
the lock.
"""

from __future__ import annotations

import sys

import psycopg
import redis

from saga.effects.locks import FencedLock
from saga.errors import LockLost

FENCED_WRITE = "UPDATE fenced SET value = %s, token = %s WHERE id = 1 AND token < %s"


def main() -> None:
    redis_url, database_url, name, lease = sys.argv[1:5]
    lock = FencedLock(redis.Redis.from_url(redis_url), name, lease=float(lease))
    token = lock.acquire(timeout=10)
    print(f"token {token}", flush=True)
    sys.stdin.readline()
    with psycopg.connect(database_url, autocommit=True) as conn:
        written = conn.execute(FENCED_WRITE, ("from the paused holder", token, token)).rowcount
    print("written" if written else "rejected", flush=True)
    try:
        lock.check()
        print("held", flush=True)
    except LockLost as exc:
        print(f"lost: {exc}", flush=True)


if __name__ == "__main__":
    main()
