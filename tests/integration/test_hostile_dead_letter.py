"""One hostile message on a queue must not blind the operator's triage command.

A message published straight onto a service's queue with a type full of Rich markup is
dead-lettered (``UnknownMessageType``); ``saga dlq list`` and ``saga dlq show`` must
then still work, and show that type as it was written.
"""

from __future__ import annotations

from saga.messaging.envelope import Envelope
from tests.support.brokers import RawMessage, TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.running import running_service
from tests.support.services import EFFECTS_DDL, Ping, service
from tests.support.wait import wait_until

HOSTILE_TYPE = "[/x] [bold]Nope[/bold]"


def test_a_message_type_full_of_markup_is_listed_and_shown_as_written(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    db.execute(EFFECTS_DDL)
    hostile = Envelope.wrap(Ping(key="hostile")).model_copy(update={"type": HOSTILE_TYPE})
    with running_service(service, db, rabbit):
        rabbit.publish_raw(service.name, hostile.to_bytes(), "application/json")
        wait_until(
            lambda: db.scalar("SELECT count(*) FROM saga.dead_letters") == 1,
            what="the hostile message dead-lettered",
        )
    assert db.rows("SELECT error_type, message_type FROM saga.dead_letters") == [
        ("UnknownMessageType", HOSTILE_TYPE)
    ]
    listed = saga_cli(db.url, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
    assert HOSTILE_TYPE in listed.stdout
    letter_id = db.scalar("SELECT id FROM saga.dead_letters")
    shown = saga_cli(db.url, "dlq", "show", str(letter_id))
    assert shown.returncode == 0, shown.stderr
    assert f"message_type: {HOSTILE_TYPE}" in shown.stdout


def test_a_body_the_brokers_client_cannot_decompress_is_dead_lettered_and_the_consumer_goes_on(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """kombu decompresses a body whose ``compression`` header it knows, before the consumer
    sees it; it raised out of the consumer's loop on one it could not, stopping the service."""
    db.execute(EFFECTS_DDL)
    plain = Envelope.wrap(Ping(key="claims gzip")).to_bytes()
    good = Envelope.wrap(Ping(key="behind")).to_bytes()
    with running_service(service, db, rabbit) as runner:
        rabbit.publish_each(
            service.name,
            [
                RawMessage(plain, headers={"compression": "application/x-gzip"}),
                RawMessage(plain, headers={"compression": "[/x] bogus"}),
                RawMessage(good),
            ],
        )
        wait_until(
            lambda: db.scalar("SELECT count(*) FROM effects WHERE key = 'behind'") == 1,
            what="the message behind them handled",
        )
        assert runner.failure is None
    letters = db.rows("SELECT error_type, error_message FROM saga.dead_letters ORDER BY id")
    assert [error_type for error_type, _ in letters] == ["UndecodableBody", "UndecodableBody"]
    assert "could not read it" in letters[0][1]
    assert "could not read it: KeyError: '[/x] bogus'" in letters[1][1]
    assert db.scalar("SELECT count(*) FROM effects") == 1
    listed = saga_cli(db.url, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
