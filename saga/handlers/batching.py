"""Services that write a whole batch of deliveries at once.

A service may carry :class:`BatchWriting`: for a batch of several deliveries the
consumer runtime opens one :class:`BatchScope`, hands it to every handler
(``ctx.batch``), and flushes it once, after the last handler and before the
commit. Handlers stage their writes in the scope instead of issuing statements,
so the batch costs a constant number of statements however many deliveries it
holds. A handler of such a service guards its own direct writes (the runtime
opens no savepoint for it), and a conflict found at the flush sends the batch
back to be handled one delivery per transaction, where no scope is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from saga.db.sql import Tx
from saga.messaging.envelope import Envelope


class BatchScope(Protocol):
    """What a service staged for one batch, written by :meth:`flush`."""

    def flush(self, tx: Tx) -> None:
        """Write everything staged, in ``tx`` (raises ``ConcurrentUpdate`` on a lost race)."""
        ...


class BatchWriting(Protocol):
    """Opens the scope of a batch, given the envelopes it will handle."""

    def open(self, tx: Tx, envelopes: Sequence[Envelope]) -> BatchScope: ...
