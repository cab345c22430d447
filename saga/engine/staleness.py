"""Whether an event still applies to a saga, decided from its record alone.

A saga waits for one message at a time (``pending_message_id``), or, at a parallel group
or a fan-out, for several (the step's state lists them). A reply, retry
timer, wait timeout or deadline that is not about that message came too late (a
duplicate, an answer to an earlier attempt, a timer that lost a race): it must
change nothing. The orchestrator asks these questions before it builds a
:class:`~saga.engine.transitions.Transition`; the model-based tests ask the same.
"""

from __future__ import annotations

from uuid import UUID

from pydantic import BaseModel

from saga.engine.state import SagaRecord, SagaStatus
from saga.messaging.control import FailureReply, StepDeadline
from saga.messaging.envelope import COMPENSATES_HEADER, Envelope


def awaits(record: SagaRecord, message_id: UUID | None) -> bool:
    """True when the saga waits for ``message_id``: its pending request or timer, or one of
    the messages its step awaits at once (``awaits`` in the step's state: a group's members,
    a fan-out's items or their compensations; or in a member's entry under ``members``: a
    fan-out member of a group undoing its items)."""
    if message_id is None:
        return False
    message = str(message_id)
    state = record.step_state
    return (
        record.pending_message_id == message_id
        or message in state.get("awaits", ())
        or any(message in entry.get("awaits", ()) for entry in state.get("members", {}).values())
    )


def awaits_reply(record: SagaRecord, envelope: Envelope) -> bool:
    """True when ``envelope`` answers the request the saga waits for."""
    return awaits(record, envelope.causation_id)


def wait_timeout_applies(record: SagaRecord, envelope: Envelope) -> bool:
    """True when the wait timeout in ``envelope`` fires before a signal ended the wait."""
    return awaits(record, envelope.message_id) and record.waiting_for is not None


def awaits_event(record: SagaRecord, event_type: str, key: str | None) -> bool:
    """True when the saga waits for the published ``event_type`` under ``key`` (the key the
    event carries for the saga's current wait step)."""
    waiting = record.status is SagaStatus.RUNNING and record.waiting_for == event_type
    return waiting and key is not None and record.wait_key == key


def deadline_applies(record: SagaRecord, deadline: StepDeadline) -> bool:
    """True when ``deadline`` passed while its step's reply is still awaited."""
    return record.status is SagaStatus.RUNNING and awaits(record, deadline.awaited)


def may_undo(reply: BaseModel, envelope: Envelope) -> bool:
    """True for a late reply that may need undoing: a step's success, not a compensation's."""
    return not isinstance(reply, FailureReply) and COMPENSATES_HEADER not in envelope.headers
