"""A saga's home: the service that runs it and the tables its progress is written to."""

from __future__ import annotations

from collections.abc import Sequence

from saga.db.sql import Tx, validate_name, validate_schema
from saga.engine.state import SagaRecord, StepLogEntry
from saga.engine.store import SagaStore
from saga.messaging.dead_letters import DeadLetter, DeadLetterStore
from saga.messaging.outbox import Outbox, OutgoingMessage


class SagaHome:
    """Where sagas live: replies come back to ``service_name``; rows go to ``schema``."""

    def __init__(self, service_name: str, schema: str = "saga", outbox: Outbox | None = None):
        self.service_name = validate_name(service_name, "service name")
        self.schema = validate_schema(schema)
        self.outbox = outbox or Outbox(self.schema)
        self.store = SagaStore(self.schema)
        self.dead_letters = DeadLetterStore(self.schema)

    def persist(
        self,
        tx: Tx,
        record: SagaRecord | None,
        log: Sequence[StepLogEntry],
        outgoing: Sequence[OutgoingMessage],
        letters: Sequence[DeadLetter],
    ) -> None:
        """Write a step's outcome: the saga row (if any), log, messages and dead letters.

        The saga row, its log and messages leased to a consumer (a transition run by a
        delivery) go in one statement; otherwise each kind goes in one of its own."""
        rows = self.outbox.rows(outgoing)  # serialized and checked once, whichever way
        leased = self.outbox.leased_statement(rows) if record is not None else None
        if record is not None and (leased is not None or not rows):
            written = self.store.save_step(tx, record, log, leased)
            if leased is not None:
                self.outbox.take_leased(written)
        else:
            if record is not None:
                self.store.save(tx, record)
            self.store.log(tx, log)
            self.outbox.insert_rows(tx, rows)
        for letter in letters:
            self.dead_letters.add(tx, letter)
