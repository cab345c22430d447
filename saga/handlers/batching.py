"""Services that write a whole batch of deliveries at once.

A service may carry :class:`BatchWriting`: for a batch of several deliveries the
consumer runtime opens one :class:`StagedWrites`, hands it to every handler
(``ctx.batch``), and flushes it once, after the last handler and before the
commit. Handlers stage their writes in the scope instead of issuing statements,
so the batch costs a constant number of statements however many deliveries it
holds. A handler of such a service guards its own direct writes (the runtime
opens no savepoint for it), and a conflict found at the flush sends the batch
back to be handled one delivery per transaction, where no scope is used.

The runtime handles deliveries in segments that share one savepoint (see
:mod:`saga.consumers.delivery_batches`): ``guarded`` says whether the delivery being
handled has a savepoint of its own. Without one, a handler that would undo part
of its own writes raises :class:`~saga.errors.NeedsSavepoint` instead; the
runtime then rolls the segment back (and the scope to its :meth:`mark`) and
handles the delivery again, guarded.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from saga.db.sql import Tx
from saga.messaging.envelope import Envelope


class StagedWrites(Protocol):
    """What a service staged for one batch, written by :meth:`flush`."""

    #: Whether the delivery being handled has a savepoint of its own (set by the runtime).
    guarded: bool

    def mark(self) -> object:
        """The staged state now, for :meth:`restore`."""
        ...

    def restore(self, mark: object) -> None:
        """Drop what was staged since :meth:`mark` returned ``mark``."""
        ...

    def flush(self, tx: Tx) -> None:
        """Write everything staged, in ``tx`` (raises ``ConcurrentUpdate`` on a lost race)."""
        ...


class BatchWriting(Protocol):
    """What a service reads in a transaction's opening statement, and the scope of a batch.

    :meth:`reading` names rows the deliveries' handlers will need: the consumer runtime
    reads them in the statement that writes the inbox rows (no statement of their own)
    and hands them to :meth:`open`, for a batch of several new deliveries, or to
    :meth:`alone` around the handling of a delivery with no scope."""

    def reading(self, envelopes: Sequence[Envelope]) -> tuple[str, list[Any]] | None:
        """A query of one jsonb column (and its parameters) whose rows the handlers of
        ``envelopes`` will need, to run inside the opening statement (None: none)."""
        ...

    def open(self, read: Sequence[Any]) -> StagedWrites:
        """The scope of a batch, given what :meth:`reading` returned for its envelopes."""
        ...

    def alone(self, read: Sequence[Any]) -> AbstractContextManager[None]:
        """What :meth:`reading` returned, offered to the handlers while the context runs."""
        ...
