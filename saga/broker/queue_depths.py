"""How many messages wait in a broker's queues (``saga stats``, the dashboard and the
Prometheus gauges). Every broker tells the messages ready in a queue, as a passive
declare (which creates nothing) answers; a broker whose capabilities have
``queue_details`` also tells them by state, and the oldest one's age. A queue with no
message may be left out: Redis and the PostgreSQL broker keep no empty queues."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from saga.broker.transport import BrokerConfig, Topology


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """One queue's messages. Beyond ``ready``, None where the broker does not tell."""

    ready: int
    #: Every message in the queue, whatever its state.
    depth: int | None = None
    #: Taken by a consumer, not yet acknowledged.
    in_flight: int | None = None
    #: Not due yet (a delay, or a released lease).
    delayed: int | None = None
    oldest_age_s: float | None = None


def declared_depths(
    config: BrokerConfig, topology: Topology, destinations: Iterable[str]
) -> dict[str, QueueDepth]:
    """Queue name -> the messages ready in it, for each of ``destinations``' queues; a
    queue the broker lacks is left out."""
    found: dict[str, QueueDepth] = {}
    with config.connected() as conn:
        channel = conn.channel()
        for destination in destinations:
            try:
                declared = topology.queue(destination)(channel).queue_declare(passive=True)
            except conn.channel_errors:  # no such queue; AMQP closed the channel for it
                channel = conn.channel()
                continue
            found[topology.queue_name(destination)] = QueueDepth(ready=int(declared.message_count))
    return found
