"""``saga demo``: the order-saga example end to end (it ships in the wheel as ``saga.examples``)."""

from __future__ import annotations

from typing import Annotated

import typer


def demo(
    orders: Annotated[int, typer.Option(help="How many orders to submit.")] = 200,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for every saga to finish.")] = 90,
    flakiness: Annotated[
        float, typer.Option(help="Probability of a transient failure in each participant call.")
    ] = 0.02,
    rate: Annotated[
        float,
        typer.Option(help="Orders submitted per second, as a steady stream (0: all at once)."),
    ] = 50,
) -> None:
    """Run four services, submit orders, show outcomes and timelines, stop cleanly.

    Uses SAGA_DATABASE_URL / SAGA_BROKER_URL when set; otherwise an embedded
    PostgreSQL and a broker on it, so no server needs to be installed.
    """
    from saga.examples.order_saga import (
        demo as example,  # not at import: keep `saga` start-up light
    )

    raise typer.Exit(example.run(orders=orders, timeout=timeout, flakiness=flakiness, rate=rate))
