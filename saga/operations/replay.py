"""Replaying and purging dead letters.

A replayed message goes into the service database's outbox in a transaction that also
marks the letter replayed and records the replay, so a replay is all or nothing. It goes
to the consumer that dead-lettered it (a subscriber's copy of an event to that
subscriber alone), or to its destination; an event that no relay could publish is
published again, to every subscriber. The message keeps its ``message_id``: a consumer
that already applied it (a replay run twice) skips it through its inbox. Its ``attempt``
header starts again at 1, so a fixed handler gets a full retry budget.

A letter is *superseded* when the saga step it belongs to was compensated in
this database since: the saga has undone the step, so running its command now
would leave an effect nobody undoes. Replay skips superseded letters unless
forced (and even then the participant refuses the command).

Purging a saga's request tells the saga (a ``purged`` failure reply in the same
transaction): a saga held at that step then compensates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pydantic import ValidationError

from saga.db.sql import Tx
from saga.errors import NotReplayable
from saga.handlers.closed_steps import ClosedSteps
from saga.messaging.control import PURGED, FailureReply
from saga.messaging.dead_letters import DeadLetterRow, DeadLetterStore
from saga.messaging.envelope import ATTEMPT_HEADER, STEP_HEADER, Envelope
from saga.messaging.outbox import Outbox, OutgoingMessage

REPLAYED_FROM_HEADER = "replayed_from"


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
    replay = envelope.with_headers(**{ATTEMPT_HEADER: "1", REPLAYED_FROM_HEADER: str(letter.id)})
    if letter.reason == "unpublishable" and letter.destination is None:
        return OutgoingMessage(replay, None)  # an event no relay could publish: publish it again
    return OutgoingMessage(replay, letter.destination or letter.consumer)


def _envelope(letter: DeadLetterRow) -> Envelope | None:
    try:
        return Envelope.from_bytes(letter.body)
    except ValidationError:
        return None


def superseded(tx: Tx, letters: Sequence[DeadLetterRow], *, schema: str = "saga") -> dict[int, str]:
    """Letter id -> why, for the letters whose saga step was compensated here since."""
    keys = {
        letter.id: key
        for letter in letters
        if (envelope := _envelope(letter)) is not None and (key := envelope.step_key)
    }
    if not keys:
        return {}
    closed = ClosedSteps(schema).find(tx, sorted(set(keys.values())))
    return {
        letter_id: f"superseded: the saga compensated step {key!r} at "
        f"{closed[key]:%Y-%m-%d %H:%M:%S %Z}; replaying it would run an undone step"
        for letter_id, key in keys.items()
        if key in closed
    }


def replay(
    conn: psycopg.Connection[Any],
    letters: Sequence[DeadLetterRow],
    criteria: dict[str, Any],
    *,
    schema: str = "saga",
    force: bool = False,
    batch_size: int = 200,
    on_progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Send ``letters`` again, one transaction per batch; every batch is recorded.

    Superseded letters are refused unless ``force``, and so are letters someone else
    replayed or purged after they were read (each batch locks its letters first).
    """
    store = DeadLetterStore(schema)
    outbox = Outbox(schema)
    result = ReplayResult()
    for start in range(0, len(letters), batch_size):
        batch = letters[start : start + batch_size]
        ids = [letter.id for letter in batch]
        with conn.transaction():
            now = store.lock(conn, ids)
            outgoing, sent = [], []
            refused = {} if force else superseded(conn, batch, schema=schema)
            refused.update(_acted_on_meanwhile(batch, now))
            for letter in batch:
                if letter.id in refused:
                    continue
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


def _acted_on_meanwhile(
    letters: Sequence[DeadLetterRow], now: dict[int, tuple[str, int]]
) -> dict[int, str]:
    """Letters another operator replayed or purged between this replay's read and its lock
    (two operators at the same moment): sent once, by the first."""
    changed = {}
    for letter in letters:
        status, count = now.get(letter.id, ("deleted", letter.replay_count))
        if (status, count) != (letter.status, letter.replay_count):
            changed[letter.id] = (
                f"{status} by someone else meanwhile (replayed {count} time(s) now); "
                "replay it again to send it once more"
            )
    return changed


def purge(
    conn: psycopg.Connection[Any],
    letters: Sequence[DeadLetterRow],
    *,
    schema: str = "saga",
    batch_size: int = 1000,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Mark ``letters`` purged, one transaction per batch; return how many were purged.

    A pending letter of a saga's request (it has a ``reply_to``) also answers the saga
    with a ``purged`` failure: the command will never run, so a saga held at that step
    compensates, the step included. A superseded letter's saga has moved on already.
    """
    store = DeadLetterStore(schema)
    outbox = Outbox(schema)
    purged = 0
    for start in range(0, len(letters), batch_size):
        batch = letters[start : start + batch_size]
        with conn.transaction():
            now = store.lock(conn, [letter.id for letter in batch])
            moved_on = superseded(conn, batch, schema=schema)
            answers = [
                answer
                for letter in batch
                if now.get(letter.id, ("gone",))[0] == "pending" and letter.id not in moved_on
                if (answer := _purged_answer(letter)) is not None
            ]
            outbox.add_many(conn, answers)
            purged += store.purge(conn, [letter.id for letter in batch])
        if on_progress:
            on_progress(len(batch))
    return purged


def _purged_answer(letter: DeadLetterRow) -> OutgoingMessage | None:
    """The failure reply that tells the sender of ``letter`` it will never run, if it waits."""
    request = _envelope(letter)
    if request is None or not request.reply_to:
        return None
    step = request.headers.get(STEP_HEADER)
    answer = Envelope.wrap(
        FailureReply(
            reason=f"dead letter {letter.id} purged by an operator ({letter.error_type})",
            code=PURGED,
            failed_type=request.type,
        ),
        saga_id=request.saga_id,
        correlation_id=request.correlation_id,
        causation_id=request.message_id,
        headers={STEP_HEADER: step} if step else None,
    )
    return OutgoingMessage(answer, request.reply_to)
