"""Messages at the edges: around the 256 KiB cap, invalid payloads, unicode, NUL characters.

Each ends in a clear outcome (handled, refused with an error, or a dead-letter row with
its reason) and none holds up the messages behind it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from saga import HandlerContext, Outbox, Saga, SagaRegistry, Service, Tx
from saga.errors import MessageTooLarge, SagaDataRefused
from saga.messaging.envelope import Envelope
from saga.messaging.outbox import DEFAULT_MAX_MESSAGE_BYTES
from saga.outbox_relay import Relay, RelayOptions
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.running import running_relay, running_service
from tests.support.services import EFFECTS_DDL, Ping, service
from tests.support.wait import wait_until

CAP = DEFAULT_MAX_MESSAGE_BYTES
UNICODE = "zürich 東京 🚀 naïve \u200b ŝ"


def _sized(size: int, n: int) -> Envelope:
    """A Ping envelope whose body is exactly ``size`` bytes (``n`` tells them apart)."""
    envelope = Envelope.wrap(Ping(key="", n=n))
    padding = size - len(envelope.to_bytes())
    sized = envelope.model_copy(update={"payload": {"key": "x" * padding, "n": n}})
    assert len(sized.to_bytes()) == size
    return sized


def _letters(db: TestDatabase) -> list[tuple[Any, ...]]:
    return db.rows(
        "SELECT reason, error_type, message_id, length(body), attempts, error_message "
        "FROM saga.dead_letters ORDER BY id"
    )


def test_bodies_around_the_cap_bad_payloads_unicode_and_nul_end_clearly_behind_nothing(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    db.execute(EFFECTS_DDL)
    under, at, over = _sized(CAP - 1, 1), _sized(CAP, 2), _sized(CAP + 1, 3)
    invalid = Envelope.wrap(Ping(key="bad")).model_copy(
        update={"payload": {"key": "bad", "n": "many"}}
    )
    nul = Envelope.wrap(Ping(key="a\x00b", n=5))
    bodies = [
        under.to_bytes(),
        at.to_bytes(),
        over.to_bytes(),
        invalid.to_bytes(),
        Envelope.wrap(Ping(key=UNICODE, n=4)).to_bytes(),
        nul.to_bytes(),
        Envelope.wrap(Ping(key="last", n=6)).to_bytes(),
    ]
    with running_service(service, db, rabbit):
        rabbit.publish_many(service.name, bodies)
        # One worker, in order: once the last is handled, so is everything before it.
        wait_until(
            lambda: db.scalar("SELECT count(*) FROM effects WHERE key = 'last'") == 1,
            what="the message behind them all handled",
        )
    assert rabbit.depth_once_released(service.name) == 0  # every one acknowledged
    handled = db.rows("SELECT seq, key = %s, length(key) FROM effects ORDER BY seq", (UNICODE,))
    assert [(seq, is_unicode) for seq, is_unicode, _ in handled] == [
        (1, False), (2, False), (4, True), (6, False)
    ]  # fmt: skip
    letters = _letters(db)
    # Over the cap by one byte: refused on its size, before it is even parsed.
    assert letters[0][:4] == ("rejected", "MessageTooLarge", None, CAP + 1)
    assert letters[1][:3] == ("rejected", "InvalidPayload", invalid.message_id)
    assert "n:" in letters[1][5]
    # A NUL no text column takes: dead-lettered after one try (no retry can mend it).
    assert letters[2][:3] == ("failed", "DataError", nul.message_id)
    assert letters[2][4] == 1 and "NUL" in letters[2][5]
    listed = saga_cli(db.url, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
    for letter_id in db.rows("SELECT id FROM saga.dead_letters"):
        shown = saga_cli(db.url, "dlq", "show", str(letter_id[0]))
        assert shown.returncode == 0, shown.stderr


def test_the_outbox_takes_a_message_at_the_cap_and_refuses_one_byte_more(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    db.execute(EFFECTS_DDL)
    outbox = Outbox()
    with db.connect(autocommit=False) as conn, conn.transaction():
        outbox.add(conn, _sized(CAP, 1), destination=service.name)
        with pytest.raises(MessageTooLarge, match=f"{CAP + 1} bytes, over the {CAP}-byte cap"):
            outbox.add(conn, _sized(CAP + 1, 2), destination=service.name)
        outbox.add(conn, Ping(key=UNICODE, n=3), destination=service.name)  # still usable
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 2
    with running_service(service, db, rabbit), running_relay(db, rabbit):
        wait_until(lambda: db.scalar("SELECT count(*) FROM effects") == 2, what="both handled")
    assert db.rows("SELECT seq, key = %s FROM effects ORDER BY seq", (UNICODE,)) == [
        (1, False),
        (3, True),
    ]


def test_a_row_over_the_brokers_limit_becomes_an_unpublishable_dead_letter(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    rabbit.declare("notes")
    with db.connect(autocommit=False) as conn, conn.transaction():
        Outbox().add(conn, _sized(4096, 1), destination="notes")
        Outbox().add(conn, Ping(key="small"), destination="notes")
    options = RelayOptions(max_broker_message_bytes=2048, max_publish_attempts=1)
    with Relay(db.url, rabbit.config, options, rabbit.topology) as relay:
        report = relay.relay_batch()
    assert (report.published, report.quarantined) == (1, 1)
    assert db.rows("SELECT reason, error_type, length(body) FROM saga.dead_letters") == [
        ("unpublishable", "MessageTooLarge", 4096)
    ]
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0
    assert len(rabbit.receive("notes", 1)) == 1 and rabbit.queue_depth("notes") == 0


class Person(BaseModel):
    name: str
    found: str | None = None


class Find(BaseModel):
    name: str


class Found(BaseModel):
    value: str


lookup = Saga("lookup", data=Person)
lookup.remote(
    "find",
    service="directory",
    command=Find,
    reply=Found,
    on_reply=lambda d, r: d.model_copy(update={"found": r.value}),
)
lookups = SagaRegistry("lookups")
lookups.register(lookup)
directory = Service("directory")


@directory.handler(Find)
def find(tx: Tx, cmd: Find, ctx: HandlerContext) -> Found:
    return Found(value=f"{cmd.name}\x00" if cmd.name == "nul" else cmd.name.upper())


@pytest.fixture
def lookups_running(db: TestDatabase, rabbit: TestBroker) -> Iterator[None]:
    with (
        running_relay(db, rabbit),
        running_service(lookups.as_service(), db, rabbit),
        running_service(directory, db, rabbit),
    ):
        yield


def test_saga_data_with_a_nul_is_refused_at_start_and_a_reply_bringing_one_at_once(
    db: TestDatabase, lookups_running: None
) -> None:
    with db.connect(autocommit=False) as conn, conn.transaction():
        with pytest.raises(SagaDataRefused, match=r"NUL character .* at data\.name"):
            lookup.start(conn, Person(name="a\x00b"))
        first = lookup.start(conn, Person(name="nul"))  # the transaction is still usable
        second = lookup.start(conn, Person(name="ok"))
    wait_until(
        lambda: (
            db.scalar("SELECT count(*) FROM saga.dead_letters") == 1
            and db.scalar("SELECT status FROM saga.saga_instances WHERE id = %s", (second,))
            == "completed"
        ),
        what="the NUL reply dead-lettered, the other saga completed",
    )
    ((consumer, reason, error_type, attempts, message),) = db.rows(
        "SELECT consumer, reason, error_type, attempts, error_message FROM saga.dead_letters"
    )
    assert (consumer, reason, error_type, attempts) == ("lookups", "failed", "SagaDataRefused", 1)
    assert "at data.found" in message
    # The saga waits at its step, where an operator sees it with the letter that explains why.
    assert db.rows("SELECT status, step FROM saga.saga_instances WHERE id = %s", (first,)) == [
        ("running", "find")
    ]
