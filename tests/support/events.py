"""Events and the services that subscribe to them, for tests in process and as
``saga consume`` subprocesses.

Each subscriber writes one row per event it handles to ``public.effects`` of its own
database (kind = its name, key = the event's key), with no unique constraint: an event
handled twice shows as two rows. ``billing`` refuses an event whose key starts with
``broken`` until ``public.repaired`` holds that key (a bug fixed by an operator).
"""

from __future__ import annotations

from typing import Any

import psycopg
from pydantic import BaseModel

from saga import HandlerContext, RetryPolicy, Service

SUBSCRIBERS = ("billing", "notices", "ledger")

REPAIRED_DDL = "CREATE TABLE IF NOT EXISTS public.repaired (key text PRIMARY KEY)"


class Happened(BaseModel):
    """The event every subscriber here handles."""

    key: str
    amount: int = 0


class Unheard(BaseModel):
    """An event nobody subscribes to."""

    key: str


class Announce(BaseModel):
    """A command whose handler publishes a :class:`Happened` (``ctx.publish``)."""

    key: str


class Proclaim(BaseModel):
    """A command whose handler publishes an :class:`Unheard` (``ctx.publish``)."""

    key: str


def _effect(tx: psycopg.Connection[Any], kind: str, key: str, amount: int = 0) -> None:
    tx.execute(
        "INSERT INTO public.effects (kind, key, seq) VALUES (%s, %s, %s)", (kind, key, amount)
    )


def _subscriber(name: str) -> Service:
    service = Service(name, retry=RetryPolicy(immediate_attempts=1, delays=()))

    @service.subscribe(Happened)
    def handle(tx: psycopg.Connection[Any], event: Happened, ctx: HandlerContext) -> None:
        if name == "billing" and event.key.startswith("broken"):
            fixed = tx.execute("SELECT 1 FROM public.repaired WHERE key = %s", (event.key,))
            if fixed.fetchone() is None:
                raise RuntimeError(f"billing cannot bill {event.key} yet")
        _effect(tx, name, event.key, event.amount)

    return service


billing, notices, ledger = (_subscriber(name) for name in SUBSCRIBERS)
subscribers = {service.name: service for service in (billing, notices, ledger)}

announcer = Service("announcer")


@announcer.handler(Announce)
def announce(tx: psycopg.Connection[Any], command: Announce, ctx: HandlerContext) -> None:
    _effect(tx, "announcer", command.key)
    ctx.publish(Happened(key=command.key, amount=1))


proclaimer = Service("proclaimer")


@proclaimer.handler(Proclaim)
def proclaim(tx: psycopg.Connection[Any], command: Proclaim, ctx: HandlerContext) -> None:
    _effect(tx, "proclaimer", command.key)
    ctx.publish(Unheard(key=command.key))
