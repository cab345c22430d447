"""Runs a service with ``concurrency`` workers, each in its own thread."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from saga.broker.transport import BrokerConfig, Topology
from saga.consumers.delivery_batches import DeliveryOutcome
from saga.consumers.worker import ConsumerOptions, Worker
from saga.handlers.service import Service
from saga.observability.metrics import Metrics

logger = logging.getLogger(__name__)


class ServiceRunner:
    """Starts the workers of one service and stops them gracefully.

    ``stop()`` lets every worker finish the batch in hand (commit, then ack);
    deliveries prefetched but not started go back to the broker.
    """

    def __init__(
        self,
        service: Service,
        database_url: str,
        broker: BrokerConfig,
        options: ConsumerOptions | None = None,
        topology: Topology | None = None,
        *,
        metrics: Metrics | None = None,
        stop_event: threading.Event | None = None,
    ) -> None:
        self.service = service
        self.options = options or ConsumerOptions()
        self.stop_event = stop_event or threading.Event()
        self.workers = [
            Worker(
                service,
                database_url,
                broker,
                self.options,
                topology,
                name=f"worker-{i + 1}",
                metrics=metrics,
            )
            for i in range(self.options.concurrency)
        ]
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for worker in self.workers:
            thread = threading.Thread(
                target=worker.run,
                args=(self.stop_event,),
                name=f"{self.service.name}-{worker.name}",
            )
            thread.start()
            self._threads.append(thread)

    def wait_ready(self, timeout: float) -> bool:
        """True once every worker is connected and consuming (False if one failed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.failure is not None:
                return False
            if all(worker.ready.is_set() for worker in self.workers):
                return True
            time.sleep(0.01)
        return False

    @property
    def failure(self) -> Exception | None:
        """The error that stopped a worker for good (bad configuration, a bug), if any."""
        return next((w.failure for w in self.workers if w.failure is not None), None)

    def stop(self, timeout: float | None = None) -> None:
        self.stop_event.set()
        for thread in self._threads:
            thread.join(timeout)

    def run(self) -> None:
        """Start, then block until :meth:`stop` (e.g. from a signal handler) completes."""
        self.start()
        while any(t.is_alive() for t in self._threads):
            for thread in self._threads:
                thread.join(0.5)
        logger.info("%s stopped: %s", self.service.name, dict(self.counts))
        if self.failure is not None:
            raise self.failure

    @property
    def counts(self) -> Counter[DeliveryOutcome]:
        total: Counter[DeliveryOutcome] = Counter()
        for worker in self.workers:
            total.update(worker.counts)
        return total
