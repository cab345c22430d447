"""kombu's in-memory broker (``memory://``): one process's queues, for tests. It carries
events (the bindings live as long as the process, which is every consumer there is)."""

from __future__ import annotations

from saga.broker.capabilities import Capabilities
from saga.broker.kind import BrokerKind


class MemoryBroker(BrokerKind):
    name = "memory"
    schemes = ("memory",)
    driver_type = "memory"
    polls = True
    capabilities = Capabilities(
        multiple_ack=False,
        heartbeats=False,
        transactional_publish=False,
        returns_unroutable=False,
        events=True,
        queue_details=False,
        delayed_delivery=False,
        routing_table=False,
    )


MEMORY = MemoryBroker()
