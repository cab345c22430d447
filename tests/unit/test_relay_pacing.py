"""How a relay paces its polls: at once while batches come back full, a short wait after one
that did not fill (the outbox is drained: a poll at once would find nothing), and a wait
that doubles while polls find nothing."""

from __future__ import annotations

import threading

from saga.broker.transport import BrokerConfig
from saga.outbox_relay.relay import BatchReport, Relay, RelayOptions

OPTIONS = RelayOptions(batch_size=500, idle_poll_min=0.01, idle_poll_max=0.04)


class ScriptedRelay(Relay):
    """A relay whose batches claim the given numbers of rows, recording its polls and waits."""

    def __init__(self, claims: list[int]) -> None:
        super().__init__("postgresql://unused/db", BrokerConfig("amqp://unused//"), OPTIONS)
        self.claims = claims
        self.steps: list[str] = []
        self.stop = threading.Event()

    def relay_batch(self, woken: bool = False) -> BatchReport:
        claimed = self.claims.pop(0)
        self.steps.append(f"batch {claimed}" + (" (woken)" if woken else ""))
        if not self.claims:
            self.stop.set()
        return BatchReport(claimed, claimed, 0, 0)

    def promote_due(self) -> int:
        return 0

    def _heartbeat(self) -> None:
        pass

    def _wait(self, stop: threading.Event, seconds: float) -> bool:
        """A NOTIFY ends the waits of the 40 ms the script reaches."""
        self.steps.append(f"wait {seconds * 1000:.0f} ms")
        return seconds == OPTIONS.idle_poll_max


def test_full_batches_go_on_at_once_a_partial_one_waits_and_empty_polls_back_off() -> None:
    relay = ScriptedRelay([500, 500, 3, 0, 0, 0, 0, 2, 0])
    relay._loop(relay.stop)
    assert relay.steps == [
        "batch 500",
        "batch 500",  # a full batch: more are waiting
        "batch 3",
        "wait 10 ms",  # drained: rows written one at a time go out a few per batch
        "batch 0",
        "wait 10 ms",
        "batch 0",
        "wait 20 ms",
        "batch 0",
        "wait 40 ms",
        "batch 0 (woken)",  # a NOTIFY ended the wait: the batch claims with no probe first
        "wait 40 ms",  # at most idle_poll_max
        "batch 2 (woken)",
        "wait 10 ms",
        "batch 0",
        "wait 10 ms",
    ]
