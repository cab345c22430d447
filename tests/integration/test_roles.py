"""Least privilege: the relay and a consumer run under the roles `saga db roles` creates."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from saga import Outbox
from saga.consumers import Outcome
from saga.messaging.envelope import Envelope
from saga.outbox_relay import Relay, RelayOptions
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase, with_credentials
from tests.support.events import Unheard, subscribers
from tests.support.running import running_service
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
        assert runner.counts[Outcome.RETRY_SCHEDULED] == 1
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
