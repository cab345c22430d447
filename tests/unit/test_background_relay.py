"""A relay run in a thread of a consumer's process (``saga consume --relay``)."""

from __future__ import annotations

import threading
from typing import Any, cast

from saga.errors import ConfigurationError
from saga.outbox_relay.background import BackgroundRelay
from saga.outbox_relay.relay import Relay


class _FailingRelay:
    def run(self, stop: threading.Event) -> None:
        raise ConfigurationError("the relay's role cannot read the outbox")


class _PatientRelay:
    def __init__(self) -> None:
        self.stopped = threading.Event()

    def run(self, stop: threading.Event) -> None:
        stop.wait()
        self.stopped.set()


def _background(relay: Any, stop: threading.Event) -> BackgroundRelay:
    return BackgroundRelay(cast(Relay, relay), stop)


def test_a_relay_that_fails_for_good_stops_the_whole_process_and_says_why() -> None:
    stop = threading.Event()
    background = _background(_FailingRelay(), stop)
    background.join(10)
    assert stop.is_set()  # the consumers stop too: nothing would relay their outbox
    assert isinstance(background.failure, ConfigurationError)


def test_a_relay_runs_until_the_process_stops() -> None:
    stop, relay = threading.Event(), _PatientRelay()
    background = _background(relay, stop)
    stop.set()
    background.join(10)
    assert relay.stopped.is_set() and background.failure is None
