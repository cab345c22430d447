"""The helpers that run a relay or a service in a thread fail the test when it died."""

from __future__ import annotations

import threading

import pytest

from saga.consumers.worker import Worker
from saga.outbox_relay import Relay
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.running import ThreadDied, in_thread, running_relay, running_service
from tests.support.services import service
from tests.support.wait import wait_until


def _bug(*args: object) -> None:
    raise RuntimeError("a bug in the loop")


def test_a_thread_that_raised_fails_the_block() -> None:
    with pytest.raises(ThreadDied, match="worker died: RuntimeError"), in_thread(_bug, "worker"):
        pass


def test_a_relay_that_died_fails_the_test(
    db: TestDatabase, rabbit: TestBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Relay, "_loop", _bug)
    died = pytest.raises(ThreadDied, match="test-relay died: RuntimeError")
    with died, running_relay(db, rabbit):
        wait_until(lambda: not _alive("test-relay"), what="the relay thread ended")


def test_a_service_whose_worker_died_fails_the_test(
    db: TestDatabase, rabbit: TestBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Worker, "_loop", _bug)
    died = pytest.raises(ThreadDied, match=f"{service.name} died: RuntimeError")
    with died, running_service(service, db, rabbit) as runner:
        wait_until(lambda: runner.failure is not None, what="the worker died")


def _alive(name: str) -> bool:
    return any(t.name == name for t in threading.enumerate())
