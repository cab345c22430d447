"""Moving messages between services in process, without a broker, recording each one.

Deterministic and quick for tests that look at every message a flow sends:
each round takes all ready outbox rows of every service database and hands
them to the destination service's batch processor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from saga import Service
from saga.consumers import Delivery, DeliveryBatchProcessor
from saga.effects.side_effects import SideEffects
from saga.messaging.envelope import Envelope


@dataclass
class Pump:
    """``services`` maps a service name to (its database URL, its Service)."""

    services: dict[str, tuple[str, Service]]
    seen: list[Envelope] = field(default_factory=list)

    def run(self, max_rounds: int = 100) -> int:
        """Deliver until every outbox is empty of ready rows; return messages delivered."""
        processors = {  # one side-effect guard (a connection pool) per service, for the run
            name: DeliveryBatchProcessor(service, effects=SideEffects(url))
            for name, (url, service) in self.services.items()
        }
        try:
            delivered = 0
            for _ in range(max_rounds):
                moved = self._round(processors)
                delivered += moved
                if not moved:
                    return delivered
            raise AssertionError(f"messages still flowing after {max_rounds} rounds")
        finally:
            for processor in processors.values():
                assert processor.effects is not None
                processor.effects.close()

    def _round(self, processors: dict[str, DeliveryBatchProcessor]) -> int:
        pending: list[tuple[str, bytes]] = []
        for url, _ in self.services.values():
            with psycopg.connect(url) as conn:
                rows = conn.execute(
                    "DELETE FROM saga.outbox WHERE deliver_after IS NULL "
                    "RETURNING destination, body, id"
                ).fetchall()
            pending.extend((r[0], bytes(r[1])) for r in sorted(rows, key=lambda r: r[2]))
        for destination, body in pending:
            self.seen.append(Envelope.from_bytes(body))
            with psycopg.connect(self.services[destination][0]) as conn:
                processors[destination].process(conn, [Delivery(body, "application/json")])
        return len(pending)


def services_of(system: Any, targets: dict[str, str]) -> dict[str, tuple[str, Service]]:
    from saga.cli.loading import load_service

    return {name: (system.database_urls[name], load_service(t)) for name, t in targets.items()}
