"""Replaying dead letters: back through the outbox, with their original message id.

A replayed message goes into the service database's outbox in a transaction
that also marks the letter replayed and records the replay, so a replay is
all or nothing. The message keeps its ``message_id``: a consumer that already
applied it (a replay run twice) skips it through its inbox. Its ``attempt``
header starts again at 1, so a fixed handler gets a full retry budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pydantic import ValidationError

from saga.dead_letters import DeadLetterRow, DeadLetterStore
from saga.envelope import ATTEMPT_HEADER, Envelope
from saga.outbox import Outbox, OutgoingMessage

REPLAYED_FROM_HEADER = "replayed_from"


class NotReplayable(Exception):
    """This letter cannot be sent again (its body is not a message envelope, or it was purged)."""


@dataclass(slots=True)
class ReplayResult:
    replayed: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    replay_ids: list[int] = field(default_factory=list)


def outgoing_for(letter: DeadLetterRow) -> OutgoingMessage:
    """The message a replay of ``letter`` sends, or :class:`NotReplayable`."""
    if letter.status == "purged":
        raise NotReplayable("it was purged")
    try:
        envelope = Envelope.from_bytes(letter.body)
    except ValidationError:
        raise NotReplayable(
            f"its body is not a message envelope ({letter.error_type}); purge it instead"
        ) from None
    destination = letter.destination or letter.consumer
    replay = envelope.with_headers(**{ATTEMPT_HEADER: "1", REPLAYED_FROM_HEADER: str(letter.id)})
    return OutgoingMessage(replay, destination)


def replay(
    conn: psycopg.Connection[Any],
    letters: Sequence[DeadLetterRow],
    criteria: dict[str, Any],
    *,
    schema: str = "saga",
    batch_size: int = 200,
    on_progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Send ``letters`` again, one transaction per batch; every batch is recorded."""
    store = DeadLetterStore(schema)
    outbox = Outbox(schema)
    result = ReplayResult()
    for start in range(0, len(letters), batch_size):
        batch = letters[start : start + batch_size]
        ids = [letter.id for letter in batch]
        with conn.transaction():
            store.lock(conn, ids)
            outgoing, sent, refused = [], [], {}
            for letter in batch:
                try:
                    outgoing.append(outgoing_for(letter))
                    sent.append(letter.id)
                except NotReplayable as exc:
                    refused[letter.id] = str(exc)
            outbox.add_many(conn, outgoing)
            store.mark_replayed(conn, sent)
            summary = f"replayed {len(sent)}" + (f", refused {len(refused)}" if refused else "")
            result.replay_ids.append(
                store.record_replay(conn, criteria, ids, len(sent), len(refused), summary)
            )
        result.replayed.extend(sent)
        result.refused.update(refused)
        if on_progress:
            on_progress(len(batch))
    return result
