"""A home service's consumer resumes its stuck sagas itself (``--resume-stuck-after``).

The sweep is a safety net for a broker that loses messages through misconfiguration (a
Redis without persistence, a queue whose length limit drops its oldest messages). Here
the command a saga sent is dropped on purpose: its outbox row deleted, or its message
purged from RabbitMQ's queue after the relay published it. Once the saga has made no
progress for the threshold, a sweep writes a resume, and the saga finishes with each
effect applied once. Sweeps of several
consumers of the same service write the same resume for the same stall, so the saga's
inbox takes it once; a sweep leaves alone what is not its own or not stuck.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from uuid import UUID

import psycopg
import pytest
from kombu import Connection

from saga.consumers import Delivery, DeliveryBatchProcessor, DeliveryOutcome
from saga.consumers.stuck_sweep import StuckSweep
from saga.messaging.envelope import Envelope
from tests.support import sagas as trips
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.pump import Pump
from tests.support.running import running_relay, running_service
from tests.support.services import EFFECTS_DDL
from tests.support.wait import wait_until

JSON = "application/json"
THRESHOLD = timedelta(minutes=30)


def _start_trip(db: TestDatabase, trip_id: str) -> None:
    db.execute(EFFECTS_DDL)  # the trip's local steps record their effects there
    with db.connect(autocommit=False) as conn, conn.transaction():
        trips.trip.start(conn, trips.TripData(trip_id=trip_id))


def _stall(db: TestDatabase, since: str = "1 hour") -> None:
    """Every saga last progressed ``since`` ago."""
    db.execute(f"UPDATE saga.saga_instances SET updated_at = now() - interval '{since}'")


def _resumes(db: TestDatabase) -> list[tuple[UUID, UUID]]:
    """(message id, saga id) of every resume waiting in the outbox."""
    rows = db.rows(
        "SELECT message_id, saga_id FROM saga.outbox WHERE message_type = 'saga.ResumeSaga' "
        "ORDER BY id"
    )
    return [(row[0], row[1]) for row in rows]


def test_a_saga_whose_command_was_lost_is_resumed_and_finishes(db: TestDatabase) -> None:
    _start_trip(db, "lost-command")
    (lost,) = db.rows("DELETE FROM saga.outbox RETURNING destination")  # the broker lost it
    assert lost[0] == "bank"
    sweep = StuckSweep("saga", "trips", THRESHOLD)
    with psycopg.connect(db.url) as conn:
        assert sweep.sweep(conn) == 0  # it progressed just now: not stuck
    _stall(db)
    with psycopg.connect(db.url) as conn:
        assert sweep.sweep(conn) == 1
    assert len(_resumes(db)) == 1

    pump = Pump({"trips": (db.url, trips.registry.as_service()), "bank": (db.url, trips.bank)})
    pump.run()
    assert db.scalar("SELECT status FROM saga.saga_instances") == "completed"
    for kind in ("open", "charge", "book", "notify", "confirm"):
        assert db.scalar("SELECT count(*) FROM effects WHERE kind = %s", (kind,)) == 1, kind
    with psycopg.connect(db.url) as conn:
        assert sweep.sweep(conn) == 0  # finished: nothing to resume
    assert sweep.resumed_total == 1


def test_a_running_home_consumer_resumes_a_saga_whose_command_was_purged_from_rabbitmq(
    db: TestDatabase, rabbit: TestBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """RabbitMQ took the command, then it is dropped on purpose. The sweep runs again
    before its resume is relayed (the relay starts later), so it writes the resume twice;
    the saga is resumed exactly once and finishes."""
    _start_trip(db, "purged-from-rabbitmq")
    with running_relay(db, rabbit):
        wait_until(
            lambda: db.scalar("SELECT count(*) FROM saga.outbox") == 0,
            timeout=30,
            what="the relay to publish the command",
        )
    with Connection(rabbit.url) as conn:  # the broker took it; now it drops it
        assert rabbit.topology.queue("bank")(conn.channel()).purge() == 1
    _stall(db)
    home = trips.registry.as_service()
    caplog.set_level(logging.WARNING, logger="saga.engine.orchestrator")
    with running_service(home, db, rabbit, resume_stuck_after=timedelta(seconds=2)) as runner:
        sweeps = [w.stuck_sweep for w in runner.workers if w.stuck_sweep]
        wait_until(
            lambda: sum(sweep.resumed_total for sweep in sweeps) >= 2,
            timeout=30,
            what="two sweeps to find the same stall",
        )
        first, second, *_ = _resumes(db)
        assert first == second  # the same message for the same stall
        with running_relay(db, rabbit), running_service(trips.bank, db, rabbit):
            wait_until(
                lambda: db.scalar("SELECT status FROM saga.saga_instances") == "completed",
                timeout=30,
                what="the resumed saga to complete",
            )
    assert db.scalar("SELECT count(*) FROM effects WHERE kind = 'charge'") == 1
    resumed = [r.getMessage() for r in caplog.records if " resumed at step " in r.getMessage()]
    assert len(resumed) == 1, resumed


def test_a_participant_consumer_does_not_sweep(db: TestDatabase, rabbit: TestBroker) -> None:
    with running_service(trips.bank, db, rabbit, resume_stuck_after=timedelta(seconds=2)) as r:
        assert all(worker.stuck_sweep is None for worker in r.workers)


def test_two_sweeps_of_the_same_stall_write_one_resume_the_inbox_takes_once(
    db: TestDatabase,
) -> None:
    _start_trip(db, "swept-twice")
    db.execute("DELETE FROM saga.outbox")
    _stall(db)
    with psycopg.connect(db.url) as conn:
        assert StuckSweep("saga", "trips", THRESHOLD).sweep(conn) == 1
        assert StuckSweep("saga", "trips", THRESHOLD).sweep(conn) == 1  # another process
    first, second = _resumes(db)
    assert first == second  # the same message for the same stall
    bodies = [bytes(row[0]) for row in db.rows("DELETE FROM saga.outbox RETURNING body")]
    home = DeliveryBatchProcessor(trips.registry.as_service())
    with psycopg.connect(db.url) as conn:
        outcomes = home.process(conn, [Delivery(body, JSON) for body in bodies])
    assert outcomes == [DeliveryOutcome.HANDLED, DeliveryOutcome.DUPLICATE]
    (command,) = db.rows("SELECT message_type FROM saga.outbox")  # the step, sent once again
    assert command[0] == "Charge"

    _stall(db)  # stalled again, since a later moment: a new resume
    with psycopg.connect(db.url) as conn:
        assert StuckSweep("saga", "trips", THRESHOLD).sweep(conn) == 1
    ((again, _),) = _resumes(db)
    assert again != first[0]


def test_a_sweep_waits_while_another_consumer_of_the_service_sweeps(db: TestDatabase) -> None:
    _start_trip(db, "locked")
    _stall(db)
    with db.connect(autocommit=False) as holder, holder.transaction():
        holder.execute("SELECT pg_advisory_xact_lock(hashtext('saga.resume-stuck.trips'))")
        with psycopg.connect(db.url) as conn:
            assert StuckSweep("saga", "trips", THRESHOLD).sweep(conn) == 0
    with psycopg.connect(db.url) as conn:
        assert StuckSweep("saga", "trips", THRESHOLD).sweep(conn) == 1


def test_a_sweep_takes_only_its_own_sagas_stuck_past_the_threshold(db: TestDatabase) -> None:
    _start_trip(db, "recent")
    _stall(db, "10 minutes")  # under the threshold
    with psycopg.connect(db.url) as conn:
        assert StuckSweep("saga", "trips", THRESHOLD).sweep(conn) == 0
        assert StuckSweep("saga", "elsewhere", timedelta(minutes=5)).sweep(conn) == 0
        assert StuckSweep("saga", "trips", timedelta(minutes=5)).sweep(conn) == 1


def test_a_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        StuckSweep("saga", "trips", timedelta(0))


def test_the_resume_carries_its_reason(db: TestDatabase) -> None:
    _start_trip(db, "reason")
    _stall(db)
    with psycopg.connect(db.url) as conn:
        StuckSweep("saga", "trips", THRESHOLD).sweep(conn)
    (body,) = db.rows("SELECT body FROM saga.outbox WHERE message_type = 'saga.ResumeSaga'")
    payload = Envelope.from_bytes(bytes(body[0])).payload
    assert payload["reason"] == "resumed automatically: no progress for 0:30:00"


@pytest.mark.parametrize(
    ("given", "said"), [("0s", "is not a positive duration"), ("soon", "is not a duration")]
)
def test_saga_consume_refuses_a_threshold_that_is_no_duration(
    db: TestDatabase, rabbit: TestBroker, given: str, said: str
) -> None:
    refused = saga_cli(
        db.url, "consume", "tests.support.sagas:registry", "--resume-stuck-after", given,
        SAGA_BROKER_URL=rabbit.url,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert said in refused.stderr.replace("\n", " "), refused.stderr
