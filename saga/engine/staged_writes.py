"""The sagas one batch of orchestrator deliveries touches: read at once, written at once.

For a batch of replies (and timers, signals, resumes) the orchestrator reads every
saga row the batch names in one statement (the consumer's opening one, which also
writes the inbox rows; a delivery alone gets its saga's row the same way), applies
each delivery's transition to its own copy of the record (two deliveries for one
saga apply in order, the second on the first's result), and stages what they
decided. :meth:`StagedSagaWrites.flush` then writes every changed row (each guarded
by the version it was read at), every step-log entry and every outgoing message in
one statement. A delivery whose handler fails stages nothing, so the batch writes
only what the committed deliveries decided.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

from saga.db.sql import Tx
from saga.engine.home import SagaHome
from saga.engine.state import SagaRecord, StepLogEntry
from saga.engine.store import records_of_documents
from saga.engine.transition_results import TransitionResult
from saga.messaging.dead_letters import DeadLetter
from saga.messaging.envelope import Envelope
from saga.messaging.outbox import OutgoingMessage
from saga.observability.metrics import Metrics


@dataclass(frozen=True, slots=True)
class _Mark:
    """What a batch had staged at one moment (lists by their lengths)."""

    read: dict[UUID, SagaRecord]
    changed: dict[UUID, SagaRecord]
    log: int
    outgoing: int
    letters: int
    ended: int
    metrics: Metrics | None


class StagedSagaWrites:
    """Staged saga changes of one batch, written by :meth:`flush`."""

    def __init__(self, home: SagaHome) -> None:
        self.home = home
        self._read: dict[UUID, SagaRecord] = {}
        self._changed: dict[UUID, SagaRecord] = {}
        self._log: list[StepLogEntry] = []
        self._outgoing: list[OutgoingMessage] = []
        self._letters: list[DeadLetter] = []
        self._ended: list[tuple[str, str]] = []
        self._metrics: Metrics | None = None
        #: Whether the delivery being handled has a savepoint of its own (set by the runtime).
        self.guarded = True

    def mark(self) -> object:
        """The staged state now, for :meth:`restore`."""
        return _Mark(
            dict(self._read),
            dict(self._changed),
            len(self._log),
            len(self._outgoing),
            len(self._letters),
            len(self._ended),
            self._metrics,
        )

    def restore(self, mark: object) -> None:
        """Drop what was staged since :meth:`mark` (its segment of the batch rolled back)."""
        assert isinstance(mark, _Mark)
        self._read, self._changed, self._metrics = mark.read, mark.changed, mark.metrics
        del self._log[mark.log :], self._outgoing[mark.outgoing :]
        del self._letters[mark.letters :], self._ended[mark.ended :]

    def take(self, records: dict[UUID, SagaRecord]) -> None:
        """Rows read for this batch (by the delivery's opening statement), for :meth:`record`
        to hand out."""
        self._read.update(records)

    def record(self, tx: Tx, saga_id: UUID) -> SagaRecord | None:
        """A copy of the saga's latest state in this batch (read now if it was not yet).

        A transition changes its copy in place; only :meth:`stage` makes it the batch's.
        """
        record = self._read.get(saga_id)
        if record is None:
            record = self.home.store.load(tx, saga_id)
            if record is None:
                return None
            self._read[saga_id] = record
        return replace(record, completed_steps=list(record.completed_steps))

    def waiting_for_event(self, event_type: str, keys: Sequence[str]) -> list[UUID]:
        """The sagas this batch read that wait for ``event_type`` under one of ``keys`` (a
        delivery earlier in the batch may have begun the wait: not yet written)."""
        return [
            saga_id
            for saga_id, record in self._read.items()
            if record.waiting_for == event_type and record.wait_key in keys
        ]

    def stage(self, result: TransitionResult, saga_name: str, metrics: Metrics | None) -> None:
        """Keep what one transition decided, to be written by :meth:`flush`."""
        record = result.record
        self._read[record.id] = self._changed[record.id] = record
        self._log.extend(result.log)
        self._outgoing.extend(result.outgoing)
        self._letters.extend(result.dead_letters)
        if result.ended is not None:
            self._ended.append((saga_name, result.ended.value))
            self._metrics = metrics or self._metrics

    def stage_log(self, entries: Sequence[StepLogEntry]) -> None:
        """Step-log entries that change no saga (an ignored late event)."""
        self._log.extend(entries)

    def flush(self, tx: Tx) -> None:
        """Write the staged rows, log, messages and dead letters; count the ended sagas."""
        self.home.persist(
            tx, list(self._changed.values()), self._log, self._outgoing, self._letters
        )
        if self._metrics is not None:
            for name, status in self._ended:
                self._metrics.saga_outcomes.labels(name, status).inc()


class SagaBatchWriting:
    """Reads the sagas a transaction's deliveries name in its opening statement, and opens
    a :class:`StagedSagaWrites` for each batch of the orchestrator's deliveries."""

    def __init__(self, home: SagaHome) -> None:
        self.home = home

    def reading(self, envelopes: Sequence[Envelope]) -> tuple[str, list[Any]] | None:
        """The rows of the sagas ``envelopes`` name, as one jsonb column (None: they name
        none)."""
        saga_ids = list({e.saga_id for e in envelopes if e.saga_id is not None})
        return self.home.store.documents_read(saga_ids) if saga_ids else None

    def open(self, read: Sequence[Any]) -> StagedSagaWrites:
        batch = StagedSagaWrites(self.home)
        batch.take(records_of_documents(read))
        return batch

    @contextmanager
    def alone(self, read: Sequence[Any]) -> Iterator[None]:
        """While a delivery with no batch scope is handled: the rows its opening statement
        read, each handed out once by :func:`opened_record`."""
        token = _opened.set(records_of_documents(read))
        try:
            yield
        finally:
            _opened.reset(token)


#: The saga rows the opening statement of the transaction at hand read, not handed out yet.
_opened: ContextVar[dict[UUID, SagaRecord] | None] = ContextVar("saga_rows_opened", default=None)


def opened_record(saga_id: UUID) -> SagaRecord | None:
    """The saga's row as the opening statement of the delivery being handled read it, the
    first time it is asked for (None after, or when it read none: read the row then)."""
    opened = _opened.get()
    return None if opened is None else opened.pop(saga_id, None)
