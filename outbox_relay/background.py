"""A relay in a thread of another process (``saga consume --relay``).

The relay stops with the process's stop event. Should it fail for good (a bad
configuration, a bug: it reconnects by itself after losing a server), it sets that
event, so that the whole process stops and says why rather than consume on while
its outbox is no longer forwarded.
"""

from __future__ import annotations

import logging
import threading

from saga.outbox_relay.relay import Relay

logger = logging.getLogger(__name__)


class BackgroundRelay:
    """Runs ``relay`` in a thread until ``stop`` is set."""

    def __init__(self, relay: Relay, stop: threading.Event) -> None:
        self.relay = relay
        self.stop = stop
        #: What ended the relay before ``stop`` was set, if anything did.
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.relay.run(self.stop)
        except BaseException as exc:
            logger.error("the relay stopped: %s; stopping the process", exc)
            self.failure = exc
            self.stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)
