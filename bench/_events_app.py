"""The services of ``bench.events``: the commands' one consumer (the subscribers are the
fan-out example's: :mod:`saga.examples.fanout.services`)."""

from __future__ import annotations

from saga import HandlerContext, Service, Tx
from saga.examples.fanout.services import Tick

commands = Service("commands")


@commands.handler(Tick)
def handle(tx: Tx, command: Tick, ctx: HandlerContext) -> None:
    tx.execute("INSERT INTO effects (n) VALUES (%s)", (command.n,))
