"""Which replies come in groups: a hint for the consumer of the saga's home.

The remote members of a parallel group answer at about the same time, and the saga goes
on only once every one has. A consumer that takes the first reply alone commits a
transaction for it, and the sibling's reply that arrives meanwhile waits behind that
transaction: the group ends a whole transaction after its last answer. Every member's
command, and so its reply, says how many replies its group joins (``JOINS_HEADER``);
told that siblings are still on their way, the consumer waits a moment for them
(:attr:`~saga.consumers.worker.ConsumerOptions.reply_linger`) and handles the replies in
one transaction.

Only a hint, kept in memory per process: what a reply does is read from the saga's
record as always. A reply whose siblings this process did not see (they went to another
process, or came before a restart) costs at most one wait; the last reply of a group
whose others this process has seen never waits.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from uuid import UUID

from saga.messaging.envelope import JOINS_HEADER, STEP_HEADER, Envelope, message_type_of

if TYPE_CHECKING:
    from saga.engine.definition import Saga

#: Sagas whose group replies are remembered at once (the oldest are forgotten first).
REMEMBERED = 10_000


class ReplyJoins:
    """The reply types of the registered sagas' joined steps, and the replies seen so far
    of each saga whose group is still out."""

    def __init__(self, sagas: Iterable[Saga[Any]]) -> None:
        #: the message types that may have siblings (checked before a body is decoded)
        self.types = frozenset(
            message_type_of(reply)
            for saga in sagas
            for step in saga.steps
            for member in step.joined_replies()
            for reply in member.expects()
        )
        self._seen: OrderedDict[UUID, set[str]] = OrderedDict()
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.types)

    def more_to_come(self, envelope: Envelope) -> bool:
        """Whether replies to the siblings of the step ``envelope`` answers are still to
        come, as far as this process has seen."""
        step, joined = envelope.headers.get(STEP_HEADER), envelope.headers.get(JOINS_HEADER)
        if step is None or envelope.saga_id is None or joined is None or not joined.isdigit():
            return False
        with self._lock:
            seen = self._seen.pop(envelope.saga_id, set())
            seen.add(step)
            if len(seen) >= int(joined):
                return False
            self._seen[envelope.saga_id] = seen
            if len(self._seen) > REMEMBERED:
                self._seen.popitem(last=False)
        return True
