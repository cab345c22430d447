"""A consumer publishing its own rows after commit, and the relays: one publishes each row.

The rows a consumer's transaction writes are leased to it: the relays leave them alone
until the lease ends, so a normal flow sees no duplicate delivery at all, and the rows of
a consumer that died go out once their lease has lapsed.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import psycopg
from pydantic import BaseModel

from saga import HandlerContext, Outbox, Service, uuid7
from saga.consumers import DeliveryOutcome
from saga.examples.order_saga.processes import SagaProcess, saga_env
from saga.messaging.envelope import Envelope
from saga.outbox_relay import Relay, RelayOptions
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.events import Announce, announcer
from tests.support.holds import Hold
from tests.support.running import in_thread, running_service
from tests.support.services import EFFECTS_DDL, Hop, Ping, service
from tests.support.wait import wait_until

JSON = "application/json"
CHAINS = 40
HOPS = 25
NOTES = "undone-notes"


class Note(BaseModel):
    text: str


class Write(BaseModel):
    key: str


writer = Service("savepoint_writer")


@writer.handler(Write)
def write(tx: psycopg.Connection[Any], command: Write, ctx: HandlerContext) -> None:
    """Writes a row in a savepoint it rolls back, then one that stays."""
    try:
        with tx.transaction():
            Outbox().add(tx, Note(text="rolled back"), destination=NOTES)
            raise RuntimeError("undone")
    except RuntimeError:
        pass
    Outbox().add(tx, Note(text="kept"), destination=NOTES)


def test_relays_polling_hard_and_publish_after_commit_deliver_each_message_once(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    db.execute(EFFECTS_DDL)
    with db.connect(autocommit=False) as conn, conn.transaction():
        for i in range(CHAINS):
            Outbox().add(
                conn,
                Hop(chain=f"c{i}", seq=1, last=HOPS),
                destination=service.name,
                saga_id=uuid7(),
            )
    eager = RelayOptions(idle_poll_min=0.001, idle_poll_max=0.002)  # always after new rows
    relays = [Relay(db.url, rabbit.config, eager, rabbit.topology) for _ in range(2)]
    with (
        running_service(service, db, rabbit) as runner,
        in_thread(relays[0].run, "relay-1"),
        in_thread(relays[1].run, "relay-2"),
    ):
        wait_until(
            lambda: (
                db.scalar("SELECT count(*) FROM effects") == CHAINS * HOPS
                and db.scalar("SELECT count(*) FROM saga.outbox") == 0
            ),
            timeout=120,
            what="every hop handled, the outbox empty",
        )
    assert runner.counts[DeliveryOutcome.DUPLICATE] == 0, runner.counts
    assert runner.counts[DeliveryOutcome.HANDLED] == CHAINS * HOPS
    assert db.scalar("SELECT count(DISTINCT (key, seq)) FROM effects") == CHAINS * HOPS
    assert rabbit.depth_once_released(service.name) == 0  # no late copy behind them
    relayed = sum(relay.published_total for relay in relays)
    print(f"\nrelays published {relayed} of {CHAINS * HOPS}, the consumer the rest")
    assert CHAINS <= relayed < CHAINS * HOPS  # both paths published rows the consumer wrote


def test_a_relay_leaves_a_row_leased_to_its_consumer_which_publishes_it_then_deletes_it(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    """The consumer is held after its commit, before it publishes its reply (and, in the
    same write, acknowledges the request): the reply's row is leased to it, and a relay
    draining the outbox meanwhile leaves it alone. Let go, the consumer publishes it, then
    deletes it (idle, in bulk)."""
    db.execute(EFFECTS_DDL)
    rabbit.declare("replies")
    request = Envelope.wrap(Ping(key="raced"), reply_to="replies")
    rabbit.publish_raw(service.name, request.to_bytes(), "application/json")
    hold = Hold("consumer.after_commit", tmp_path)
    consumer = SagaProcess(
        ["consume", "tests.support.services:service", "--publish-lease", "600"],
        {**saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix), **hold.env},
        tmp_path,
        "consumer",
    )
    hold.wait_held(consumer)
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 1  # the reply, committed
    with Relay(db.url, rabbit.config, RelayOptions(), rabbit.topology) as relay:
        assert relay.drain() == 0  # leased: not the relay's to publish
    assert rabbit.queue_depth("replies") == 0
    hold.release()
    consumer.wait_for_output(f"fault point {hold.point} released", 30)
    wait_until(
        lambda: db.scalar("SELECT count(*) FROM saga.outbox") == 0,
        what="the consumer deleting the row it published",
    )
    consumer.proc.send_signal(signal.SIGTERM)
    assert consumer.wait(60) == 0, consumer.output()
    # The relay and the consumer have both stopped: every copy there will be is queued.
    assert rabbit.queue_depth("replies") == 1
    replies = rabbit.receive("replies", 1)
    assert [json.loads(m.body)["payload"]["key"] for m in replies] == ["raced"]
    assert rabbit.queue_depth("replies") == 0


def test_a_relay_publishes_the_rows_of_a_consumer_that_died_once_their_lease_lapsed(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    """A consumer killed right after its commit never publishes its reply; a relay does,
    when the lease ends."""
    db.execute(EFFECTS_DDL)
    rabbit.declare("replies")
    request = Envelope.wrap(Ping(key="orphan"), reply_to="replies")
    rabbit.publish_raw(service.name, request.to_bytes(), "application/json")
    doomed = SagaProcess(
        ["consume", "tests.support.services:service", "--publish-lease", "1"],
        {
            **saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix),
            "SAGA_FAULTS": "consumer.after_commit",
        },
        tmp_path,
        "doomed",
    )
    assert doomed.wait(60) == -signal.SIGKILL, doomed.output()
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 1  # committed, never published
    with Relay(db.url, rabbit.config, RelayOptions(), rabbit.topology) as relay:
        wait_until(lambda: relay.drain() == 1, what="the relay taking the lapsed row")
    # The relay has stopped and the consumer is dead: every copy there will be is queued.
    assert rabbit.queue_depth("replies") == 1
    replies = rabbit.receive("replies", 1)
    assert [json.loads(m.body)["payload"]["key"] for m in replies] == ["orphan"]
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 0


def test_a_row_the_broker_refuses_goes_to_the_relays_at_once_not_when_its_lease_ends(
    db: TestDatabase, redis_url: str
) -> None:
    """Redis carries no events: the consumer's publish of the announcer's event fails, and
    it gives the row up to the relays there and then (a relay dead-letters it), although
    its lease would hold for ten minutes."""
    db.execute(EFFECTS_DDL)
    broker = TestBroker(redis_url, "redis", accepts_message_loss=True)
    try:
        with running_service(announcer, db, broker, publish_lease=600.0) as runner:
            broker.publish_raw(announcer.name, Envelope.wrap(Announce(key="a1")).to_bytes(), JSON)
            wait_until(
                lambda: runner.counts[DeliveryOutcome.HANDLED] == 1, what="the command handled"
            )
            wait_until(
                lambda: (
                    db.scalar("SELECT count(*) FROM saga.outbox WHERE deliver_after IS NULL") == 1
                ),
                what="the refused event's row given up to the relays",
            )
        with Relay(db.url, broker.config, RelayOptions(), broker.topology) as relay:
            report = relay.relay_batch()
        assert (report.claimed, report.quarantined) == (1, 1)
    finally:
        broker.cleanup()


def test_a_row_a_handler_wrote_in_a_savepoint_it_rolled_back_is_never_published(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """The row was leased to the consumer as the handler wrote it; the savepoint took it
    back, and the consumer, alone in its transaction with no savepoint of its own, must
    find that out before it publishes: only the row that stayed goes out."""
    rabbit.declare(NOTES)
    with running_service(writer, db, rabbit) as runner:
        rabbit.publish_raw(writer.name, Envelope.wrap(Write(key="w")).to_bytes(), JSON)
        wait_until(lambda: runner.counts[DeliveryOutcome.HANDLED] == 1, what="handled")
        wait_until(lambda: db.scalar("SELECT count(*) FROM saga.outbox") == 0, what="settled")
    assert rabbit.depth_once_released(NOTES) == 1
    assert [json.loads(m.body)["payload"]["text"] for m in rabbit.receive(NOTES, 1)] == ["kept"]
