"""A saga's home: the service that runs it and the tables its progress is written to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from saga.db.sql import Tx, validate_name, validate_schema
from saga.engine.state import SagaRecord, StepLogEntry
from saga.engine.store import SagaStore
from saga.messaging.dead_letters import DeadLetter, DeadLetterStore
from saga.messaging.outbox import EmbeddedInsert, NewOutboxRow, Outbox, OutgoingMessage


class SagaHome:
    """Where sagas live: replies come back to ``service_name``; rows go to ``schema``."""

    def __init__(self, service_name: str, schema: str = "saga", outbox: Outbox | None = None):
        self.service_name = validate_name(service_name, "service name")
        self.schema = validate_schema(schema)
        self.outbox = outbox or Outbox(self.schema)
        self.store = SagaStore(self.schema)
        self.dead_letters = DeadLetterStore(self.schema)

    def start(
        self,
        tx: Tx,
        record: SagaRecord,
        fingerprint: str | None,
        log: Sequence[StepLogEntry],
        outgoing: Sequence[OutgoingMessage],
        letters: Sequence[DeadLetter],
    ) -> bool:
        """Write a new saga as its first transition left it: its row, log and messages in
        one statement, then its dead letters. False, and nothing of it left written, if
        its idempotency key is taken."""
        rows = self.outbox.rows(outgoing)  # serialized and checked before anything is written
        messages = self.outbox.embedded_statement(rows)
        written = self.store.insert_step(tx, record, fingerprint, log, messages)
        if written is None:
            return False
        self._written(tx, rows, messages, written, letters)
        return True

    def persist(
        self,
        tx: Tx,
        records: Sequence[SagaRecord],
        log: Sequence[StepLogEntry],
        outgoing: Sequence[OutgoingMessage],
        letters: Sequence[DeadLetter],
    ) -> None:
        """Write what transitions decided: the saga rows, log and messages in one statement
        (messages that take two statements apart), then the dead letters."""
        rows = self.outbox.rows(outgoing)  # serialized and checked before anything is written
        messages = self.outbox.embedded_statement(rows)
        written = self.store.save_steps(tx, records, log, messages)
        self._written(tx, rows, messages, written, letters)

    def _written(
        self,
        tx: Tx,
        rows: Sequence[NewOutboxRow],
        messages: EmbeddedInsert | None,
        written: Sequence[Any],
        letters: Sequence[DeadLetter],
    ) -> None:
        """After the saga's statement: hand over the messages it wrote (``messages``, which
        returned ``written``), or write ``rows`` now; then the dead letters."""
        if messages is not None:
            self.outbox.take_written(messages, written)
        else:
            self.outbox.insert_rows(tx, rows)
        for letter in letters:
            self.dead_letters.add(tx, letter)
