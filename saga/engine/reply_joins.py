"""Which replies come in groups: a hint for the consumer of the saga's home.

The commands a transition sends together (a parallel group's remote members and the first
items of its fan-outs, or a fan-out's first items) are answered at about the same time,
and the saga goes on only once every one has. A consumer that takes the first reply alone
commits a transaction for it, and the replies that arrive meanwhile wait behind that
transaction: the step ends a whole transaction after its last answer. So each of those
commands, and so its reply, says how many replies it joins (``JOINS_HEADER``, stamped by
:func:`join_replies` on what the transition sends); told that siblings are still on their
way, the consumer waits a moment for them
(:attr:`~saga.consumers.worker.ConsumerOptions.reply_linger`) and handles the replies in
one transaction.

Only a hint, kept in memory per process: what a reply does is read from the saga's
record as always. A reply whose siblings this process did not see (they went to another
process, or came before a restart) costs at most one wait; the last reply of a group
whose others this process has seen never waits. Commands sent later (a fan-out's next
items, a retry, a resume) carry no count and never make a reply wait.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from uuid import UUID

from saga.messaging.envelope import JOINS_HEADER, STEP_HEADER, Envelope, message_type_of
from saga.messaging.outbox import OutgoingMessage

if TYPE_CHECKING:
    from saga.engine.definition import Saga

#: Sagas whose group replies are remembered at once (the oldest are forgotten first).
REMEMBERED = 10_000


def join_replies(outgoing: list[OutgoingMessage], awaited: Collection[str]) -> None:
    """Stamp how many replies they join on the messages of ``outgoing`` whose ids are in
    ``awaited`` (the commands a step sent together and awaits all of), when there are
    several."""
    joined = [
        i for i, message in enumerate(outgoing) if str(message.envelope.message_id) in awaited
    ]
    if len(joined) < 2:
        return
    for i in joined:
        envelope = outgoing[i].envelope
        headers = {**envelope.headers, JOINS_HEADER: str(len(joined))}
        outgoing[i] = replace(
            outgoing[i], envelope=envelope.model_copy(update={"headers": headers})
        )


class ReplyJoins:
    """The reply types of the registered sagas' joined steps, and the replies seen so far
    of each saga whose joined commands are still out."""

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
        """Whether replies to the siblings of the command ``envelope`` answers are still to
        come, as far as this process has seen."""
        step, joined = envelope.headers.get(STEP_HEADER), envelope.headers.get(JOINS_HEADER)
        if step is None or envelope.saga_id is None or joined is None or not joined.isdigit():
            return False
        # the command answered tells a fan-out's items apart (they share the step's name)
        answered = str(envelope.causation_id) if envelope.causation_id else step
        with self._lock:
            seen = self._seen.pop(envelope.saga_id, set())
            seen.add(answered)
            if len(seen) >= int(joined):
                return False
            self._seen[envelope.saga_id] = seen
            if len(self._seen) > REMEMBERED:
                self._seen.popitem(last=False)
        return True
