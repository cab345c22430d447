"""The event of the fan-out run and its three subscribers.

Each subscriber writes one row per event it handles to ``effects`` of its own database,
with no unique key: an event handled twice shows as two rows, one never handled as a
number missing.
"""

from __future__ import annotations

from pydantic import BaseModel

from saga import HandlerContext, Service, Tx

SUBSCRIBERS = ("audit", "billing", "reporting")

#: The table every database of the run gets: the publisher's record of what it
#: published, and each subscriber's effects.
SCHEMA = """
CREATE TABLE IF NOT EXISTS published (n integer PRIMARY KEY);
CREATE TABLE IF NOT EXISTS effects (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    n          integer     NOT NULL,
    handled_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


class Tick(BaseModel):
    """Event number ``n`` of the run."""

    n: int


def _subscriber(name: str) -> Service:
    service = Service(name)

    @service.subscribe(Tick)
    def handle(tx: Tx, event: Tick, ctx: HandlerContext) -> None:
        tx.execute("INSERT INTO effects (n) VALUES (%s)", (event.n,))

    return service


audit, billing, reporting = (_subscriber(name) for name in SUBSCRIBERS)
