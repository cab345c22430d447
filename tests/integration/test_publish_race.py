"""A consumer publishing its own rows after commit races the relays for them: one wins.

Whichever takes a row (the relay's claim, or the consumer's ``DELETE ... RETURNING``,
both under ``SKIP LOCKED``) is the only one to publish it, so a normal flow sees no
duplicate delivery at all.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from saga import Outbox, uuid7
from saga.consumers import Outcome
from saga.examples.order_saga.processes import SagaProcess, saga_env
from saga.messaging.envelope import Envelope
from saga.outbox_relay import Relay, RelayOptions
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.holds import Hold
from tests.support.running import in_thread, running_relay, running_service
from tests.support.services import EFFECTS_DDL, Hop, Ping, service
from tests.support.wait import wait_until

CHAINS = 40
HOPS = 25


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
    assert runner.counts[Outcome.DUPLICATE] == 0, runner.counts
    assert runner.counts[Outcome.HANDLED] == CHAINS * HOPS
    assert db.scalar("SELECT count(DISTINCT (key, seq)) FROM effects") == CHAINS * HOPS
    assert rabbit.depth_once_released(service.name) == 0  # no late copy behind them
    relayed = sum(relay.published_total for relay in relays)
    print(f"\nrelays published {relayed} of {CHAINS * HOPS}, the consumer the rest")
    assert CHAINS <= relayed < CHAINS * HOPS  # both paths published rows the consumer wrote


def test_a_row_the_relay_took_while_the_consumer_was_about_to_publish_it_goes_out_once(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    """The consumer is held after its commit and ack, before it publishes its reply; a
    relay publishes the reply meanwhile; let go, the consumer finds nothing left to send."""
    db.execute(EFFECTS_DDL)
    rabbit.declare("replies")
    request = Envelope.wrap(Ping(key="raced"), reply_to="replies")
    rabbit.publish_raw(service.name, request.to_bytes(), "application/json")
    hold = Hold("consumer.after_ack", tmp_path)
    consumer = SagaProcess(
        ["consume", "tests.support.services:service"],
        {**saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix), **hold.env},
        tmp_path,
        "consumer",
    )
    hold.wait_held(consumer)
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 1  # the reply, committed
    with running_relay(db, rabbit):
        wait_until(lambda: db.scalar("SELECT count(*) FROM saga.outbox") == 0, what="relayed")
    hold.release()
    consumer.wait_for_output(f"fault point {hold.point} released", 30)
    consumer.proc.send_signal(signal.SIGTERM)  # it stops once its publish-after-commit is done
    assert consumer.wait(60) == 0, consumer.output()
    # The relay and the consumer have both stopped: every copy there will be is queued.
    assert rabbit.queue_depth("replies") == 1
    replies = rabbit.receive("replies", 1)
    assert [json.loads(m.body)["payload"]["key"] for m in replies] == ["raced"]
