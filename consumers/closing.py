"""The last statement of a consumer's transaction: everything the batch still has to write.

One statement, whatever the batch holds (writable CTEs): the outbox rows its handlers
sent, leased to this consumer (:mod:`saga.messaging.leases`); the replies kept with
their inbox rows; which of the rows leased earlier in the transaction are still there
(a savepoint that rolled back took its rows with it, and they must not be published; the
rows the saga engine's flush leased at the top level need no such check);
the deletion of the rows this consumer published after earlier commits, and the count of
the events among them that reached no subscriber, unless the transaction's opening
statement did both (it does whenever the batch has a delivery to open). Run at the
top level of the transaction, after every savepoint, so nothing it writes rolls back
short of the whole transaction.

Without leases (the consumer leaves publishing to the relays), the rows are written as
an application writes them, and the relays are woken.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from saga.consumers.inbox import Inbox
from saga.db.sql import Tx, render
from saga.messaging.leases import Leases, Settled
from saga.messaging.outbox import NewOutboxRow, Outbox, OutgoingMessage, held_back
from saga.outbox_relay.claims import RelayStore

_CONFIRM = "SELECT id FROM {schema}.outbox WHERE id = ANY(%b::bigint[])"

_WRITTEN = "SELECT id, message_id, destination, message_type, body FROM written"

_CONFIRMED = "SELECT id, NULL::uuid, NULL::text, NULL::text, NULL::bytea FROM confirmed"


class Closing:
    """Builds and runs a batch's closing statement on one schema."""

    def __init__(self, schema: str, outbox: Outbox, inbox: Inbox) -> None:
        self.outbox = outbox
        self.inbox = inbox
        self.relay_store = RelayStore(schema)
        self._confirm = render(_CONFIRM, schema)

    def close(
        self,
        tx: Tx,
        consumer: str,
        rows: Sequence[NewOutboxRow],
        replies: Sequence[tuple[UUID, OutgoingMessage]],
        leases: Leases | None,
        opened: Settled,
    ) -> Settled:
        """Write ``rows`` and keep ``replies``; with ``leases``, leave in its ``written`` only
        rows that will commit, delete its ``published`` and count its ``unrouted`` beyond
        what the transaction's opening statement settled (``opened``). Returns what of
        ``leases`` the transaction records (to forget once it commits)."""
        if leases is None or any(held_back(row) for row in rows):
            # held back rows wait for their time, not for this consumer
            self.outbox.insert_rows(tx, [r for r in rows if leases is None or held_back(r)])
        now = [] if leases is None else [row for row in rows if not held_back(row)]
        earlier = [] if leases is None else leases.unconfirmed()
        published = [] if leases is None else leases.published[opened.published :]
        unrouted = [] if leases is None else leases.unrouted[opened.unrouted :]
        settled = Settled(opened.published + len(published), opened.unrouted + len(unrouted))
        ctes: list[str] = []
        params: list[Any] = []
        selects: list[str] = []
        if now:
            assert leases is not None
            query, values = self.outbox.leased_insert(now, leases.lease)
            ctes.append(f"written AS ({query})")
            params += values
            selects.append(_WRITTEN)
        if replies:
            bodies = {
                row.message_id: row.body for row in rows
            }  # a reply is one of the rows, mostly
            query, values = self.inbox.replies_kept(consumer, replies, bodies)
            ctes.append(f"kept AS ({query})")
            params += values
        if earlier:
            ctes.append(f"confirmed AS ({self._confirm})")
            params.append(earlier)
            selects.append(_CONFIRMED)
        settling, values = self.relay_store.settling(published, unrouted)
        ctes += settling
        params += values
        if not ctes:
            return settled
        statement = "WITH " + ",\n".join(ctes) + "\n" + ("\nUNION ALL\n".join(selects) or "SELECT")
        returned = tx.execute(statement, params, prepare=True).fetchall()
        if leases is not None and selects:
            leases.keep({row[0] for row in returned if row[1] is None})
            leases.add_written([row for row in returned if row[1] is not None])
        return settled
