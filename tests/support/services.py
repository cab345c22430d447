"""Services that tests run in process or as ``saga consume`` subprocesses.

Every effect is a row in ``public.effects`` with no unique constraint, so a
duplicate effect shows up as a duplicate row instead of being hidden.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import TYPE_CHECKING, Any

import psycopg
from pydantic import BaseModel

from saga import HandlerContext, RetryPolicy, Service, StepFailed

if TYPE_CHECKING:
    from tests.support.databases import TestDatabase

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS public.effects (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind       text    NOT NULL,
    key        text    NOT NULL,
    seq        integer NOT NULL DEFAULT 0,
    pid        integer NOT NULL DEFAULT pg_backend_pid(),
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

SERVICE_NAME = os.environ.get("SAGA_TEST_SERVICE", "effects")


class Ping(BaseModel):
    key: str
    n: int = 0


class Pong(BaseModel):
    key: str


class Hop(BaseModel):
    """One link of a chain: its handler sends the next link until ``last``."""

    chain: str
    seq: int
    last: int


class Refuse(BaseModel):
    key: str


class Flaky(BaseModel):
    key: str
    fail_times: int


class Crash(BaseModel):
    """A message its handler kills the process on (SIGKILL, nothing committed), every time."""

    key: str


def effects_per_key(db: TestDatabase, kind: str) -> dict[str, int]:
    """How many times each key got an effect of ``kind`` (a duplicate counts 2, not 1)."""
    rows = db.rows("SELECT key, count(*) FROM public.effects WHERE kind = %s GROUP BY key", (kind,))
    return {key: int(n) for key, n in rows}


def record_effect(tx: psycopg.Connection[Any], kind: str, key: str, seq: int = 0) -> None:
    """A business effect, one row in ``public.effects`` (``EFFECTS_DDL``)."""
    tx.execute("INSERT INTO public.effects (kind, key, seq) VALUES (%s, %s, %s)", (kind, key, seq))


service = Service(
    SERVICE_NAME,
    retry=RetryPolicy(immediate_attempts=2, immediate_initial_wait=0.0, delays=(0.05, 0.05)),
)


@service.handler(Ping)
def handle_ping(tx: psycopg.Connection[Any], msg: Ping, ctx: HandlerContext) -> Pong | None:
    record_effect(tx, "ping", msg.key, msg.n)
    return Pong(key=msg.key) if ctx.envelope.reply_to else None


@service.handler(Hop)
def handle_hop(tx: psycopg.Connection[Any], msg: Hop, ctx: HandlerContext) -> None:
    record_effect(tx, "hop", msg.chain, msg.seq)
    if msg.seq < msg.last:
        ctx.send(Hop(chain=msg.chain, seq=msg.seq + 1, last=msg.last), to=ctx.service)


@service.handler(Crash)
def handle_crash(tx: psycopg.Connection[Any], msg: Crash, ctx: HandlerContext) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@service.handler(Refuse)
def handle_refuse(tx: psycopg.Connection[Any], msg: Refuse, ctx: HandlerContext) -> None:
    record_effect(tx, "refuse-write-rolled-back", msg.key)
    raise StepFailed(f"refusing {msg.key}", code="refused")


_flaky_tries: Counter[str] = Counter()


def reset_counters() -> None:
    """Forget the tries counted so far (an autouse fixture calls it before every test)."""
    _flaky_tries.clear()


@service.handler(Flaky)
def handle_flaky(tx: psycopg.Connection[Any], msg: Flaky, ctx: HandlerContext) -> None:
    """Fails the first ``fail_times`` tries in this process, then applies its effect."""
    _flaky_tries[msg.key] += 1
    if _flaky_tries[msg.key] <= msg.fail_times:
        raise RuntimeError(f"flaky failure {_flaky_tries[msg.key]} of {msg.fail_times}")
    record_effect(tx, "flaky-done", msg.key, _flaky_tries[msg.key])
