"""kombu's in-memory broker (``memory://``): one process's queues, for tests. It carries
events (the bindings live as long as the process, which is every consumer there is).

kombu's memory channel drops what its consumer had not acknowledged when it closes;
here it puts those messages back in their queues, flagged redelivered, as every other
broker does for a consumer that dies.
"""

from __future__ import annotations

from kombu.transport import memory

from saga.broker.capabilities import Capabilities
from saga.broker.kind import BrokerKind

#: kombu's memory transport, giving back the unacknowledged messages of a closed channel.
REDELIVERING_TRANSPORT = "saga.broker.memory:Transport"


class Channel(memory.Channel):  # type: ignore[misc]
    do_restore = True


class Transport(memory.Transport):  # type: ignore[misc]
    Channel = Channel


class MemoryBroker(BrokerKind):
    name = "memory"
    schemes = ("memory",)
    driver_type = "memory"
    polls = True
    capabilities = Capabilities(
        multiple_ack=False,
        heartbeats=False,
        confirmed_publish=False,
        returns_unroutable=False,
        returns_unrouted_events=False,
        events=True,
        queue_details=False,
        delayed_delivery=False,
        routing_table=False,
    )

    def transport(self, scheme: str) -> str | None:
        return REDELIVERING_TRANSPORT


MEMORY = MemoryBroker()
