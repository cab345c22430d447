"""Outbox rows leased to the consumer that writes them, so that it publishes them itself.

A consumer publishes the messages its transaction wrote right after that transaction
commits, with no second transaction: while :func:`leasing` is active, every message
:class:`~saga.messaging.outbox.Outbox` writes for now (not one held back with
``deliver_after``) is written with ``deliver_after`` set to the end of the lease, which
keeps the relays off it: they take a row only once its ``deliver_after`` has passed.
The insert hands back the rows it wrote (:attr:`Leases.written`); the consumer publishes
them after its commit and lists them in :attr:`Leases.published`, and deletes those in
bulk later (in its next transaction, or when it is idle). Rows it fails to publish it
hands to the relays at once (their lease released); a consumer that dies leaves its
rows to the relays once the lease has lapsed: published then, or published again
(consumers deduplicate).

Rows written in a savepoint that rolls back are gathered too; the consumer keeps only
those its transaction's last statement still finds (see :mod:`saga.consumers.closing`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

#: How long a consumer's rows are its own to publish, unless its options say otherwise.
DEFAULT_LEASE = timedelta(seconds=5)


@dataclass(frozen=True, slots=True)
class LeasedRow:
    """One outbox row as written under a lease: what publishing it takes."""

    id: int
    message_id: UUID
    destination: str | None  # None: an event, for every subscriber of its type
    message_type: str
    body: bytes


@dataclass(slots=True)
class Leases:
    """One consumer's leased rows: written in its open transaction, and published since."""

    lease: timedelta = DEFAULT_LEASE
    #: rows leased in the open transaction (some may have rolled back with a savepoint)
    written: list[LeasedRow] = field(default_factory=list)
    #: ids of the rows of ``written`` leased outside every savepoint (:meth:`standing_writes`):
    #: they commit with the transaction, or not at all
    standing: set[int] = field(default_factory=set)
    #: The open transaction runs with no savepoint of the consumer's, and any failure in it
    #: rolls it all back: the saga engine's writes in it stand (:meth:`standing_writes`).
    savepoint_free: bool = False
    #: ids of rows published after their commit, to delete
    published: list[int] = field(default_factory=list)
    #: types of the events published after their commit that reached no subscriber, to
    #: count (``events_unrouted``) with the rows' deletion
    unrouted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.lease <= timedelta(0):
            raise ValueError(f"a publish lease must be positive, not {self.lease}")

    def add_written(self, returned: Sequence[Sequence[Any]]) -> list[int]:
        """Take rows a leased insert returned (id, message_id, destination, message_type,
        body); return their ids."""
        rows = [LeasedRow(r[0], r[1], r[2], r[3], bytes(r[4])) for r in returned]
        self.written.extend(rows)
        return [row.id for row in rows]

    def forget_written(self, savepoint_free: bool = False) -> None:
        """Forget the rows leased so far: a new transaction begins (what one rolled back
        leased too), ``savepoint_free`` or not."""
        self.written.clear()
        self.standing.clear()
        self.savepoint_free = savepoint_free

    @contextmanager
    def standing_writes(self) -> Iterator[None]:
        """A block of the framework's own writes, no handler's code inside it, that no
        savepoint can take back without the whole transaction (the saga engine's flush at
        the top level, or its writes in a savepoint-free transaction): the rows it leases
        need no check that they are still there before the transaction ends."""
        first = len(self.written)
        yield
        self.standing.update(row.id for row in self.written[first:])

    def unconfirmed(self) -> list[int]:
        """The ids of the rows leased in the transaction that a savepoint may have taken
        back (all but the standing ones)."""
        return [row.id for row in self.written if row.id not in self.standing]

    def keep(self, confirmed: set[int]) -> None:
        """Forget the rows a savepoint took back: keep the standing rows and ``confirmed``
        (those of :meth:`unconfirmed` still there at the transaction's end)."""
        self.written[:] = [r for r in self.written if r.id in confirmed or r.id in self.standing]


@dataclass(frozen=True, slots=True)
class Settled:
    """How much of a consumer's earlier publishing one of its transactions recorded: the
    first ``published`` rows deleted, the first ``unrouted`` events counted."""

    published: int = 0
    unrouted: int = 0

    def forget(self, leases: Leases) -> None:
        """Drop what the transaction recorded from ``leases`` (once it has committed)."""
        del leases.published[: self.published]
        del leases.unrouted[: self.unrouted]


_active: ContextVar[Leases | None] = ContextVar("saga_outbox_leases", default=None)


@contextmanager
def leasing(leases: Leases) -> Iterator[Leases]:
    """Lease the outbox rows written in this context (thread or task) to ``leases``.

    Writes made while leasing do not wake the relays: the writer publishes them.
    """
    leases.forget_written()
    token = _active.set(leases)
    try:
        yield leases
    finally:
        _active.reset(token)


def active_leases() -> Leases | None:
    """The leases of the current context, if it is leasing."""
    return _active.get()
