"""Guarded side effects: call the outside world once per key, whatever retries happen.

A row per key in ``side_effects`` moves ``pending -> in_progress -> succeeded |
failed`` with optimistic, owner-checked transitions, each in a short transaction
of its own: no database connection or lock is held while the call runs.

    effects = SideEffects(database_url)
    charge = effects.run(
        ctx.idempotency_key,                                  # same on every retry and replay
        call=lambda: gateway.charge(ctx.idempotency_key, amount),
        on_takeover=lambda: gateway.find_charge(ctx.idempotency_key),
    )

- A second attempt at a key that succeeded gets the recorded result; nothing is called.
- Concurrent attempts: one calls, the others wait for its outcome and return it.
- An ``in_progress`` row whose lease ran out (its worker died mid-call) is taken
  over by the next attempt, which runs ``on_takeover`` first: it should ask the
  external system whether the call happened; a non-None answer is recorded as
  the result and the call is not repeated.
- An exception from the call releases the key (``pending``) so a later retry may
  call again; exceptions listed in ``permanent`` record ``failed`` instead.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from saga.db.sql import render
from saga.errors import LeaseLost, SideEffectBusy, SideEffectFailed
from saga.faults import fault_point
from saga.observability.redaction import redact_url

logger = logging.getLogger(__name__)

#: How long a call may run before another attempt may take its key over, unless configured.
DEFAULT_LEASE = timedelta(seconds=30)

_INSERT = """
INSERT INTO {schema}.side_effects (key, state, owner, lease_until, attempts)
VALUES (%s, 'in_progress', %s, now() + %s::interval, 1)
ON CONFLICT (key) DO NOTHING
RETURNING key
"""
_LOCK = """
SELECT state, lease_until < now(), result, error FROM {schema}.side_effects
WHERE key = %s FOR UPDATE
"""
_TAKE = """
UPDATE {schema}.side_effects
SET state = 'in_progress', owner = %s, lease_until = now() + %s::interval,
    attempts = attempts + 1, takeovers = takeovers + %s, updated_at = now()
WHERE key = %s
"""
_FINISH = """
UPDATE {schema}.side_effects
SET state = %s, result = %s, error = %s, owner = NULL, lease_until = NULL, updated_at = now()
WHERE key = %s AND owner = %s AND state = 'in_progress'
"""
_RELEASE = """
UPDATE {schema}.side_effects
SET state = 'pending', owner = NULL, lease_until = NULL, error = %s, updated_at = now()
WHERE key = %s AND owner = %s AND state = 'in_progress'
"""


@dataclass(frozen=True, slots=True)
class _Claim:
    kind: str  # 'mine', 'done', 'failed', 'busy'
    takeover: bool = False
    result: Any = None
    error: str | None = None


class SideEffects:
    """The guard, on the service's own database (its ``side_effects`` table)."""

    def __init__(
        self,
        database_url: str,
        *,
        schema: str = "saga",
        lease: timedelta = DEFAULT_LEASE,
        poll: float = 0.05,
        max_connections: int = 4,
        connection_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.lease = lease
        self.poll = poll
        self._pool = ConnectionPool(
            database_url,
            min_size=1,
            max_size=max_connections,
            kwargs={"autocommit": True, **(connection_kwargs or {})},
            open=False,
            name="side-effects",
        )
        self._url = database_url
        self._open_lock = threading.Lock()
        self._insert = render(_INSERT, schema)
        self._lock = render(_LOCK, schema)
        self._take = render(_TAKE, schema)
        self._finish = render(_FINISH, schema)
        self._release = render(_RELEASE, schema)

    def __repr__(self) -> str:
        return f"SideEffects({redact_url(self._url)!r}, lease={self.lease})"

    def close(self) -> None:
        self._pool.close()

    def run(
        self,
        key: str,
        call: Callable[[], Any],
        *,
        on_takeover: Callable[[], Any] | None = None,
        lease: timedelta | None = None,
        wait_timeout: float | None = None,
        permanent: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """Return the outcome of ``call()`` for ``key``, calling it at most once per success.

        The result must be JSON-serializable (it is stored).
        """
        lease = lease or self.lease
        owner = uuid.uuid4()
        deadline = time.monotonic() + (wait_timeout or 2 * lease.total_seconds())
        while True:
            claim = self._claim(key, owner, lease)
            if claim.kind == "done":
                return claim.result
            if claim.kind == "failed":
                raise SideEffectFailed(f"side effect {key!r} failed before: {claim.error}")
            if claim.kind == "mine":
                break
            if time.monotonic() > deadline:
                raise SideEffectBusy(f"side effect {key!r} is still in progress elsewhere")
            time.sleep(self.poll)
        if claim.takeover and on_takeover is not None:
            found = on_takeover()
            if found is not None:
                logger.warning("side effect %s: took over, and it had happened; recorded", key)
                self._close_out(key, owner, "succeeded", found, None)
                return found
        try:
            result = call()
        except permanent as exc:
            self._close_out(key, owner, "failed", None, f"{type(exc).__name__}: {exc}")
            raise
        except Exception as exc:
            self._run_sql(self._release, (f"{type(exc).__name__}: {exc}"[:500], key, owner))
            raise
        fault_point("side_effect.after_call")
        self._close_out(key, owner, "succeeded", result, None)
        return result

    # -- the state machine -----------------------------------------------------

    def _claim(self, key: str, owner: uuid.UUID, lease: timedelta) -> _Claim:
        with self._connection() as conn, conn.transaction():
            if conn.execute(self._insert, (key, owner, lease)).fetchone():
                return _Claim("mine")
            row = conn.execute(self._lock, (key,)).fetchone()
            assert row is not None
            state, expired, result, error = row
            if state == "succeeded":
                return _Claim("done", result=result)
            if state == "failed":
                return _Claim("failed", error=error)
            if state == "in_progress" and not expired:
                return _Claim("busy")
            takeover = state == "in_progress"  # its lease ran out: the worker died mid-call
            conn.execute(self._take, (owner, lease, int(takeover), key))
            return _Claim("mine", takeover=takeover)

    def _close_out(
        self, key: str, owner: uuid.UUID, state: str, result: Any, error: str | None
    ) -> None:
        updated = self._run_sql(
            self._finish, (state, Jsonb(result) if result is not None else None, error, key, owner)
        )
        if not updated:
            raise LeaseLost(
                f"side effect {key!r} outlived its lease and was taken over; its outcome "
                "is the new owner's to record"
            )

    def _run_sql(self, query: str, params: tuple[Any, ...]) -> int:
        with self._connection() as conn:
            rowcount: int = conn.execute(query, params).rowcount
            return rowcount

    def _connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        with self._open_lock:
            if self._pool.closed:
                self._pool.open(wait=True)
        return self._pool.connection()
