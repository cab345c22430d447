"""Redis locks with fencing tokens, for work serialized across services that share no database.

    with FencedLock(redis.Redis(), "inventory-sync", lease=10) as lock:
        downstream.write(value, fencing_token=lock.token)    # downstream rejects stale tokens
        lock.check()                                         # raises LockLost if it was lost

A lock has a lease (Redis expiry), renewed by a background thread while held.
Each acquisition gets a fencing token from a counter that only grows. A holder
paused past its lease (GC pause, SIGSTOP, a slow disk) can wake up believing it
still holds the lock, so a lock alone cannot protect a resource: the resource
must remember the highest token it accepted and refuse lower ones. Losing the
lock (lease expired, Redis unreachable during renewal) is never ignored:
``check()`` and leaving the ``with`` block raise :class:`LockLost`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from types import TracebackType

import redis

from saga.errors import LockLost, LockTimeout

logger = logging.getLogger(__name__)

_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return redis.call('INCR', KEYS[2])
end
return false
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


class FencedLock:
    """A lease-based Redis lock that hands out a monotonically increasing fencing token."""

    def __init__(
        self,
        client: redis.Redis,
        name: str,
        *,
        lease: float = 10.0,
        renew_every: float | None = None,
        prefix: str = "saga:lock:",
    ) -> None:
        self.client = client
        self.name = name
        self.lease = lease
        self.renew_every = renew_every or lease / 3
        self.key = f"{prefix}{name}"
        self.fence_key = f"{prefix}{name}:fence"
        self.owner = uuid.uuid4().hex
        self.token: int | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def __repr__(self) -> str:
        return f"FencedLock({self.name!r}, token={self.token}, lease={self.lease})"

    def acquire(self, timeout: float | None = None, poll: float = 0.05) -> int:
        """Wait for the lock (up to ``timeout`` seconds); return its fencing token."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            token = self._acquire(
                keys=[self.key, self.fence_key], args=[self.owner, int(self.lease * 1000)]
            )
            if token:
                self.token = int(token)
                self._lost = None
                self._stop.clear()
                self._renewer = threading.Thread(
                    target=self._keep_alive, name=f"lock-{self.name}", daemon=True
                )
                self._renewer.start()
                return self.token
            if deadline is not None and time.monotonic() > deadline:
                raise LockTimeout(f"lock {self.name!r} not acquired within {timeout}s")
            time.sleep(poll)

    def check(self) -> None:
        """Raise :class:`LockLost` if the lock is no longer held."""
        if self._lost:
            raise LockLost(f"lock {self.name!r} (token {self.token}) was lost: {self._lost}")

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(self.lease)
        try:
            self._release(keys=[self.key], args=[self.owner])
        except redis.RedisError as exc:
            logger.warning("releasing lock %s failed (it will expire): %s", self.name, exc)
        self.check()

    def __enter__(self) -> FencedLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def _keep_alive(self) -> None:
        while not self._stop.wait(self.renew_every):
            try:
                renewed = self._renew(keys=[self.key], args=[self.owner, int(self.lease * 1000)])
            except redis.RedisError as exc:
                self._lost = f"renewal failed: {type(exc).__name__}: {exc}"
            else:
                if not renewed:
                    self._lost = (
                        "the lease expired before it was renewed (another holder may exist)"
                    )
            if self._lost:
                logger.error("lock %s lost: %s", self.name, self._lost)
                return
