"""A reply the broker lost: the participant answers the duplicate with its first reply.

A broker that forgets (Redis without persistence) may lose a participant's reply
after the participant committed its work and its inbox row. ``saga resume`` then
sends the command again under its original message id; the participant, which
skips the duplicate, must still answer it with what it replied the first time
(same message ids), or the saga waits forever.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg

from saga.consumers import Delivery, DeliveryBatchProcessor, DeliveryOutcome
from saga.messaging.envelope import Envelope
from saga.operations.resume import SagaResumer, StuckFilter
from tests.support import sagas as trips
from tests.support.databases import TestDatabase
from tests.support.pump import Pump
from tests.support.services import EFFECTS_DDL, Ping, Refuse, service

JSON = "application/json"


def _request(message: Ping | Refuse) -> Delivery:
    envelope = Envelope.wrap(message).model_copy(update={"reply_to": "requester"})
    return Delivery(envelope.to_bytes(), JSON)


def _take_outbox(db: TestDatabase) -> list[tuple[Any, ...]]:
    """Delete and return the outbox rows (what a relay would publish, or a broker lose)."""
    rows = db.rows("DELETE FROM saga.outbox RETURNING message_id, destination, body")
    return sorted((row[0], row[1], bytes(row[2])) for row in rows)


def _process(db: TestDatabase, deliveries: list[Delivery]) -> list[DeliveryOutcome]:
    with psycopg.connect(db.url) as conn:
        return DeliveryBatchProcessor(service).process(conn, deliveries)


def test_a_duplicate_is_answered_again_with_the_replies_sent_the_first_time(
    db: TestDatabase,
) -> None:
    db.execute(EFFECTS_DDL)
    ping, refused = _request(Ping(key="p")), _request(Refuse(key="r"))
    assert _process(db, [ping, refused]) == [
        DeliveryOutcome.HANDLED,
        DeliveryOutcome.BUSINESS_FAILURE,
    ]
    first = _take_outbox(db)  # the replies, then lost by the broker
    assert [row[1] for row in first] == ["requester", "requester"]

    assert _process(db, [ping, refused]) == [DeliveryOutcome.DUPLICATE, DeliveryOutcome.DUPLICATE]
    assert _take_outbox(db) == first  # the same replies: same ids, same bytes
    assert db.scalar("SELECT count(*) FROM effects") == 1  # the ping's effect, once

    # a batch with nothing already handled neither looks up nor keeps anything extra
    assert _process(db, [Delivery(Envelope.wrap(Ping(key="q")).to_bytes(), JSON)]) == [
        DeliveryOutcome.HANDLED
    ]
    assert db.scalar("SELECT count(*) FROM saga.inbox_replies") == 2
    assert _take_outbox(db) == []


def test_two_copies_in_one_batch_reply_once(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)
    ping = _request(Ping(key="twice"))
    assert _process(db, [ping, ping]) == [DeliveryOutcome.HANDLED, DeliveryOutcome.DUPLICATE]
    assert len(_take_outbox(db)) == 1


def test_a_saga_whose_reply_was_lost_finishes_when_resumed(db: TestDatabase) -> None:
    """The bank charged and replied; the reply is lost; one resume finishes the saga."""
    db.execute(EFFECTS_DDL)
    with db.connect(autocommit=False) as conn, conn.transaction():
        trips.trip.start(conn, trips.TripData(trip_id="lost-reply"))
    bank = DeliveryBatchProcessor(trips.bank)
    (command,) = _take_outbox(db)
    assert command[1] == "bank"
    with psycopg.connect(db.url) as conn:
        assert bank.process(conn, [Delivery(bytes(command[2]), JSON)]) == [DeliveryOutcome.HANDLED]
    (reply,) = _take_outbox(db)  # the Charged reply, lost with the broker
    assert reply[1] == "trips"

    resumer = SagaResumer("saga")
    with db.connect(autocommit=False) as conn:
        stuck = resumer.find_stuck(conn, StuckFilter(stuck_after=timedelta(0)))
        assert len(stuck) == 1
        resumer.resume_stuck(conn, stuck, reason="broker lost the reply")
    pump = Pump({"trips": (db.url, trips.registry.as_service()), "bank": (db.url, trips.bank)})
    pump.run()
    assert db.scalar("SELECT status FROM saga.saga_instances") == "completed"
    assert reply[0] in {envelope.message_id for envelope in pump.seen}  # answered again
    for kind in ("open", "charge", "book", "notify", "confirm"):
        assert db.scalar("SELECT count(*) FROM effects WHERE kind = %s", (kind,)) == 1, kind
