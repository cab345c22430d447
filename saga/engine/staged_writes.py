"""The sagas one batch of orchestrator deliveries touches: read at once, written at once.

For a batch of replies (and timers, signals, resumes) the orchestrator reads every
saga row the batch names in one statement, applies each delivery's transition to
its own copy of the record (two deliveries for one saga apply in order, the
second on the first's result), and stages what they decided. :meth:`StagedSagaWrites.flush`
then writes every changed row (each guarded by the version it was read at), every
step-log entry and every outgoing message in one statement. A delivery whose
handler fails stages nothing, so the batch writes only what the committed
deliveries decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from uuid import UUID

from saga.db.sql import Tx
from saga.engine.home import SagaHome
from saga.engine.state import SagaRecord, StepLogEntry
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

    def read_all(self, tx: Tx, saga_ids: Sequence[UUID]) -> None:
        """Read the rows of ``saga_ids`` in one statement, for :meth:`record` to hand out."""
        self._read.update(self.home.store.load_many(tx, saga_ids))

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
    """Opens a :class:`StagedSagaWrites` for each batch of the orchestrator's deliveries."""

    def __init__(self, home: SagaHome) -> None:
        self.home = home

    def open(self, tx: Tx, envelopes: Sequence[Envelope]) -> StagedSagaWrites:
        batch = StagedSagaWrites(self.home)
        batch.read_all(tx, list({e.saga_id for e in envelopes if e.saga_id is not None}))
        return batch
