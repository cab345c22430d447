"""A forward command that arrives while its step's compensation is being handled.

The command's opening statement (inbox row, shared step-key lock, closed-steps read) waits
for the compensation's exclusive lock; once the compensation commits, the command must
find its step closed and not run: the read comes after the lock, in a fresh snapshot.
"""

from __future__ import annotations

import threading

import psycopg

from saga.consumers import Delivery, DeliveryBatchProcessor, DeliveryOutcome
from saga.handlers.closed_steps import ClosedSteps
from saga.messaging.envelope import IDEMPOTENCY_KEY_HEADER, Envelope
from tests.support.databases import TestDatabase
from tests.support.services import EFFECTS_DDL, Ping, service
from tests.support.wait import wait_until

KEY = "saga-1:reserve"


def test_a_command_waiting_for_its_compensation_finds_its_step_closed(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)
    command = Envelope.wrap(Ping(key="late"), headers={IDEMPOTENCY_KEY_HEADER: KEY})
    outcomes: list[DeliveryOutcome] = []

    def handle() -> None:
        with psycopg.connect(db.url) as conn:
            delivery = Delivery(command.to_bytes(), "application/json")
            outcomes.extend(DeliveryBatchProcessor(service).process(conn, [delivery]))

    handling = threading.Thread(target=handle, name="command")
    with db.connect(autocommit=False) as compensation, compensation.transaction():
        ClosedSteps("saga").close(compensation, service.name, KEY)  # holds the step's lock
        handling.start()
        wait_until(lambda: db.waiting_on_locks() == 1, what="the command waiting for the lock")
    handling.join(30)
    assert not handling.is_alive()
    assert outcomes == [DeliveryOutcome.STALE]
    assert db.scalar("SELECT count(*) FROM public.effects") == 0  # the command never ran
