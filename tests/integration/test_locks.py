"""Redis locks with fencing tokens, on a real Redis."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import uuid

import pytest
import redis

from saga.effects.locks import FencedLock
from saga.errors import LockLost, LockTimeout
from saga.examples.order_saga.processes import REPO
from tests.support import servers
from tests.support.databases import TestDatabase
from tests.support.lock_holder import FENCED_WRITE
from tests.support.wait import wait_until


def _name() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def test_tokens_grow_and_the_lock_excludes(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    name = _name()
    with FencedLock(client, name, lease=2) as first:
        other = FencedLock(client, name, lease=2)
        with pytest.raises(LockTimeout):
            other.acquire(timeout=0.3)
    with FencedLock(client, name, lease=2) as second:
        assert second.token == (first.token or 0) + 1


def test_the_lease_is_renewed_while_held(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    lock = FencedLock(client, _name(), lease=1.5)  # renewed every 0.5 s
    lock.acquire()
    ttl_seen: list[int] = []

    def renewed_four_times() -> bool:
        ttl_seen.append(client.pttl(lock.key))
        assert ttl_seen[-1] > 0, ttl_seen  # it never expired in between
        return sum(later > earlier for earlier, later in itertools.pairwise(ttl_seen)) >= 4

    wait_until(renewed_four_times, timeout=60, what="four renewals (more than one lease)")
    lock.check()  # and the holder still believes it holds it
    lock.release()
    assert client.exists(lock.key) == 0


def test_a_paused_holder_gets_its_stale_token_rejected(redis_url: str, db: TestDatabase) -> None:
    db.execute("CREATE TABLE fenced (id int PRIMARY KEY, value text, token bigint NOT NULL)")
    db.execute("INSERT INTO fenced VALUES (1, 'initial', 0)")
    name = _name()
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.support.lock_holder", redis_url, db.url, name, "1"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    stale = int(holder.stdout.readline().split()[1])
    os.kill(holder.pid, signal.SIGSTOP)  # paused past its lease: renewal stops
    client = redis.Redis.from_url(redis_url)
    wait_until(lambda: client.exists(f"saga:lock:{name}") == 0, timeout=10, what="lease expiry")
    with FencedLock(client, name, lease=5) as new:
        assert (new.token or 0) > stale
        with db.connect() as conn:
            written = conn.execute(FENCED_WRITE, ("from the new holder", new.token, new.token))
            assert written.rowcount == 1
        os.kill(holder.pid, signal.SIGCONT)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "rejected"
        assert holder.stdout.readline().startswith("lost")
    holder.wait(10)
    assert db.rows("SELECT value, token FROM fenced") == [("from the new holder", new.token)]


@pytest.mark.redis  # a redis-server of its own
def test_losing_redis_while_holding_is_surfaced(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = servers.require_program("redis-server", servers.REDIS_SERVER_HINT)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(port=port, socket_timeout=1)
        wait_until(lambda: _pings(client), timeout=10, what="private redis")
        lock = FencedLock(client, "doomed", lease=0.6)
        lock.acquire()
        proc.terminate()
        proc.wait(10)
        with pytest.raises(LockLost, match="renewal failed"):
            wait_until(lambda: lock.check() or False, timeout=30, what="loss noticed")
    finally:
        if proc.poll() is None:
            proc.kill()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_leaving_the_with_block_after_the_lock_was_lost_raises(redis_url: str) -> None:
    """The lease ran out and another holder took the lock while the block ran: leaving the
    block raises LockLost, and leaves the other holder's lock alone."""
    client = redis.Redis.from_url(redis_url)
    with (
        pytest.raises(LockLost, match="was lost"),
        FencedLock(client, _name(), lease=1.5) as lock,  # renewed every 0.5 s
    ):
        client.set(lock.key, "another holder")
        wait_until(lambda: not _still_held(lock), timeout=30, what="the renewal to fail")
    assert client.get(lock.key) == b"another holder"


def _still_held(lock: FencedLock) -> bool:
    try:
        lock.check()
    except LockLost:
        return False
    return True
