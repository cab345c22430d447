"""Least privilege: the relay and a consumer run under the roles `saga db roles` creates."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from saga import Outbox
from saga.consumers import DeliveryOutcome
from saga.effects.side_effects import SideEffects
from saga.errors import ConfigurationError
from saga.messaging.envelope import Envelope
from saga.outbox_relay import Relay, RelayOptions
from tests.support import sagas as trips
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase, with_credentials
from tests.support.events import Unheard, subscribers
from tests.support.running import running_relay, running_service
from tests.support.services import EFFECTS_DDL, Flaky, Ping, service
from tests.support.wait import wait_until


def as_user(db: TestDatabase, user: str) -> str:
    return with_credentials(db.url, user)


@pytest.fixture
def roles(db: TestDatabase) -> Iterator[dict[str, str]]:
    prefix = f"r{uuid.uuid4().hex[:8]}"
    result = saga_cli(db.url, "db", "roles", "--apply", "--prefix", prefix)
    assert result.returncode == 0, result.stderr
    db.execute(EFFECTS_DDL)
    logins = {}
    for kind in ("relay", "service", "operator"):
        login = f"{prefix}_{kind}_login"
        db.execute(f'CREATE ROLE "{login}" LOGIN IN ROLE "{prefix}_{kind}"')
        logins[kind] = login
    db.execute(f'GRANT SELECT, INSERT ON public.effects TO "{prefix}_service"')
    db.execute(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO "{prefix}_service"')
    yield logins
    for role in [*logins.values(), *(f"{prefix}_{k}" for k in logins)]:
        db.execute(f'DROP OWNED BY "{role}"')
        db.execute(f'DROP ROLE "{role}"')


def test_relay_role_relays_and_may_touch_nothing_else(
    db: TestDatabase, rabbit: TestBroker, roles: dict[str, str]
) -> None:
    with db.connect(autocommit=False) as conn, conn.transaction():
        Outbox().add(conn, Ping(key="r"), destination="notes")
        Outbox().publish(conn, Unheard(key="r"))  # nobody subscribes: counted, under the role
    with Relay(
        as_user(db, roles["relay"]), rabbit.config, RelayOptions(), rabbit.topology
    ) as relay:
        assert relay.drain() == 2
    assert len(rabbit.receive("notes", 1)) == 1
    assert db.rows("SELECT message_type, events FROM saga.events_unrouted") == [("Unheard", 1)]
    with psycopg.connect(as_user(db, roles["relay"]), autocommit=True) as conn:
        for statement in (
            "DELETE FROM public.effects",
            "SELECT * FROM saga.inbox",
            "INSERT INTO saga.inbox (consumer, message_id) VALUES ('x', gen_random_uuid())",
            "UPDATE saga.saga_instances SET status = 'completed'",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
                conn.execute(statement)  # type: ignore[arg-type]


def test_consumer_runs_under_the_service_role(
    db: TestDatabase, rabbit: TestBroker, roles: dict[str, str]
) -> None:
    service_db = TestDatabase(as_user(db, roles["service"]), db.name)
    request = Envelope.wrap(Ping(key="s")).model_copy(update={"reply_to": "requester"})
    failing = Envelope.wrap(Flaky(key=f"role-{uuid.uuid4().hex}", fail_times=1000))
    with running_service(service, service_db, rabbit) as runner:
        rabbit.publish_raw(service.name, request.to_bytes(), "application/json")
        rabbit.publish_raw(service.name, b"junk", "application/json")  # a dead letter, too
        rabbit.publish_raw(service.name, failing.to_bytes(), "application/json")  # a retry
        wait_until(lambda: sum(runner.counts.values()) == 3, what="handled under the role")
        assert runner.counts[DeliveryOutcome.RETRY_SCHEDULED] == 1
        (reply,) = rabbit.receive("requester", 1)  # published by the consumer, under the role
        rabbit.publish_raw(service.name, request.to_bytes(), "application/json")  # a duplicate
        (again,) = rabbit.receive("requester", 1)  # answered again with the kept reply
        assert again.body == reply.body
    assert Envelope.from_bytes(reply.body).causation_id == request.message_id
    assert db.scalar("SELECT count(*) FROM effects") == 1
    assert db.scalar("SELECT count(*) FROM saga.dead_letters") == 1
    denied = pytest.raises(psycopg.errors.InsufficientPrivilege)
    with psycopg.connect(service_db.url, autocommit=True) as conn, denied:
        conn.execute("DELETE FROM saga.dead_letters")  # replaying and purging: operators


def test_a_subscriber_records_its_bindings_under_the_service_role(
    db: TestDatabase, rabbit: TestBroker, roles: dict[str, str]
) -> None:
    service_db = TestDatabase(as_user(db, roles["service"]), db.name)
    with running_service(subscribers["notices"], service_db, rabbit):
        pass
    recorded = db.rows("SELECT consumer, message_type, queue FROM saga.subscriptions")
    assert recorded == [("notices", "Happened", rabbit.topology.queue_name("notices"))]


def test_operator_reads_and_replays_but_cannot_write_business_tables(
    db: TestDatabase, roles: dict[str, str]
) -> None:
    body = Envelope.wrap(Ping(key="o")).to_bytes()
    letter = db.scalar(
        "INSERT INTO saga.dead_letters (consumer, reason, body, error_type, error_message) "
        "VALUES ('effects', 'failed', %s, 'E', 'boom') RETURNING id",
        (body,),
    )
    result = saga_cli(as_user(db, roles["operator"]), "dlq", "replay", str(letter))
    assert result.returncode == 0, result.stderr
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 1
    denied = pytest.raises(psycopg.errors.InsufficientPrivilege)
    with psycopg.connect(as_user(db, roles["operator"]), autocommit=True) as conn, denied:
        conn.execute("DELETE FROM public.effects")


def test_sagas_run_under_the_service_and_relay_roles_and_operators_resume_them(
    db: TestDatabase, rabbit: TestBroker, roles: dict[str, str]
) -> None:
    """The app starts sagas, the orchestrator and its participant run them (local steps,
    replies, retries on a timer, compensations) and the relay carries every message, each
    under its role; an operator resumes a saga whose compensation failed."""
    service_db = TestDatabase(as_user(db, roles["service"]), db.name)
    relay_db = TestDatabase(as_user(db, roles["relay"]), db.name)
    with service_db.connect(autocommit=False) as conn, conn.transaction():
        done = trips.trip.start(conn, trips.TripData(trip_id="ok", vip=True, notify_failures=1))
        undone = trips.trip.start(conn, trips.TripData(trip_id="undo", book_fails=True))
        stuck = trips.trip.start(
            conn, trips.TripData(trip_id="stuck", book_fails=True, refund_failures=10_000)
        )
    with (
        running_relay(relay_db, rabbit),
        running_service(trips.registry.as_service(), service_db, rabbit),
        running_service(trips.bank, service_db, rabbit),
    ):
        ends = {done: "completed", undone: "compensated", stuck: "compensation_failed"}
        wait_until(lambda: _statuses(db) == ends, what="each saga at its end")
        trips.FIXED_REFUNDS.add("ch-stuck")
        resumed = saga_cli(as_user(db, roles["operator"]), "resume", str(stuck))
        assert resumed.returncode == 0, resumed.stderr
        wait_until(lambda: _statuses(db)[stuck] == "compensated", what="resumed to its end")
    kinds = db.rows("SELECT kind, count(*) FROM effects GROUP BY kind ORDER BY kind")
    assert kinds == [("book", 1), ("charge", 3), ("close", 2), ("confirm", 1), ("notify", 1),
                     ("open", 3), ("refund", 2), ("upgrade", 1)]  # fmt: skip


def _statuses(db: TestDatabase) -> dict[Any, str]:
    return dict(db.rows("SELECT id, status FROM saga.saga_instances"))


def test_guarded_side_effects_run_under_the_service_role(
    db: TestDatabase, roles: dict[str, str]
) -> None:
    db.execute(
        "INSERT INTO saga.side_effects (key, state, owner, lease_until, attempts) "
        "VALUES ('dead-worker', 'in_progress', gen_random_uuid(), now() - interval '1 s', 1)"
    )
    effects = SideEffects(as_user(db, roles["service"]), lease=timedelta(seconds=30))
    try:
        assert effects.run("k", call=lambda: {"n": 1}) == {"n": 1}
        assert effects.run("k", call=lambda: {"n": 2}) == {"n": 1}  # recorded, not called
        with pytest.raises(ConnectionError):
            effects.run("flaky", call=lambda: (_ for _ in ()).throw(ConnectionError("down")))
        assert effects.run("flaky", call=lambda: {"n": 3}) == {"n": 3}  # released, called again
        taken = effects.run("dead-worker", call=lambda: {"n": 4}, on_takeover=lambda: None)
        assert taken == {"n": 4}
    finally:
        effects.close()
    states = db.rows("SELECT key, state, takeovers FROM saga.side_effects ORDER BY key")
    assert states == [("dead-worker", "succeeded", 1), ("flaky", "succeeded", 0),
                      ("k", "succeeded", 0)]  # fmt: skip


def test_relay_role_defers_and_quarantines_what_it_cannot_publish(
    db: TestDatabase, rabbit: TestBroker, roles: dict[str, str]
) -> None:
    rabbit.declare("notes")
    with db.connect(autocommit=False) as conn, conn.transaction():
        Outbox().add(conn, Ping(key="lost"), destination="nowhere")  # no queue: returned
        Outbox().add(conn, Ping(key="fine"), destination="notes")
    options = RelayOptions(declare_queues=False, max_publish_attempts=2, retry_base_delay=0.0)
    with Relay(as_user(db, roles["relay"]), rabbit.config, options, rabbit.topology) as relay:
        first = relay.relay_batch()
        assert (first.published, first.deferred) == (1, 1)
        relay.promote_due()
        assert relay.relay_batch().quarantined == 1
    assert db.rows("SELECT consumer, reason, error_type FROM saga.dead_letters") == [
        ("outbox_relay", "unpublishable", "Unroutable")
    ]
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0


def test_operators_prune_every_kind_of_row_past_retention(
    db: TestDatabase, roles: dict[str, str]
) -> None:
    old = "now() - interval '90 days'"
    with db.connect(autocommit=False) as conn, conn.transaction():
        finished = trips.trip.start(conn, trips.TripData(trip_id="old"))
    for statement in (
        f"UPDATE saga.saga_instances SET status = 'completed', finished_at = {old}",
        f"INSERT INTO saga.saga_steps (saga_id, step, phase, outcome, started_at, finished_at) "
        f"VALUES ('{finished}', 'open_trip', 'forward', 'succeeded', {old}, {old})",
        f"INSERT INTO saga.inbox (consumer, message_id, received_at) "
        f"VALUES ('c', gen_random_uuid(), {old})",
        "INSERT INTO saga.inbox_replies (consumer, message_id, reply_id, destination, "
        f"message_type, body, sent_at) VALUES ('c', gen_random_uuid(), gen_random_uuid(), "
        f"'x', 'Pong', '{{}}', {old})",
        f"INSERT INTO saga.closed_steps (step_key, consumer, closed_at) VALUES ('k', 'c', {old})",
        "INSERT INTO saga.dead_letters (consumer, reason, body, error_type, error_message, "
        f"status, last_replayed_at) VALUES ('c', 'failed', '{{}}', 'E', 'e', 'replayed', {old})",
        "INSERT INTO saga.dead_letter_replays (replayed_at, criteria, dead_letter_ids, "
        f"replayed, refused, result) VALUES ({old}, '{{}}', '{{1}}', 1, 0, 'ok')",
        "INSERT INTO saga.claim_checks (id, content_type, content, expires_at) "
        f"VALUES (gen_random_uuid(), 'application/json', '{{}}', {old})",
    ):
        db.execute(statement)
    result = saga_cli(as_user(db, roles["operator"]), "db", "prune")
    assert result.returncode == 0, result.stderr
    for table in ("saga_instances", "saga_steps", "inbox", "inbox_replies", "closed_steps",
                  "dead_letters", "dead_letter_replays", "claim_checks"):  # fmt: skip
        assert db.scalar(f"SELECT count(*) FROM saga.{table}") == 0, table  # type: ignore[arg-type]


def test_a_relay_asked_to_prune_under_the_relay_role_says_what_it_lacks(
    db: TestDatabase, rabbit: TestBroker, roles: dict[str, str]
) -> None:
    options = RelayOptions(prune_interval=60.0)
    relay = Relay(as_user(db, roles["relay"]), rabbit.config, options, rabbit.topology)
    with pytest.raises(ConfigurationError, match=r"prune.*DELETE on saga\.inbox"):
        relay.connect()
    relay.close()
