"""UUIDv7 identifiers: time-ordered, so indexes on them stay compact."""

from __future__ import annotations

import os
import threading
import time
from uuid import UUID


class _Uuid7Generator:
    """Makes UUIDv7 values (RFC 9562) that are monotonic within this process.

    Within one millisecond the 12-bit ``rand_a`` field is a counter seeded at
    random, so ids made in a row sort in creation order.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._counter = 0

    def __call__(self) -> UUID:
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms > self._last_ms:
                self._last_ms = ms
                self._counter = int.from_bytes(os.urandom(2), "big") & 0x07FF
            else:
                self._counter += 1
                if self._counter > 0x0FFF:  # counter exhausted: borrow the next millisecond
                    self._last_ms += 1
                    self._counter = 0
            ms, counter = self._last_ms, self._counter
        rand_b = int.from_bytes(os.urandom(8), "big") & 0x3FFF_FFFF_FFFF_FFFF
        value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand_b
        return UUID(int=value)


uuid7 = _Uuid7Generator()
"""Return a new UUIDv7, monotonic within this process."""
