"""``lone_delivery_commands``: what PostgreSQL receives for a delivery that arrives alone.

A participant (one handler: a business update and a reply) runs as a consumer on a
scratch database that logs every statement (:mod:`bench.statement_log`). One forward
command with a step key and a reply address is published to it, and the server's log
is read from then until the reply is on the broker: the framework's commands are the
delivery's transaction less the handler's statement, plus whatever came after it before
the reply went out (publishing used to take a transaction of its own).
``tests/integration/test_lone_delivery_commands.py`` holds the same count to at most
four and none.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from kombu import Connection, Producer
from pydantic import BaseModel

from bench.environment import ADMIN_URL, AMQP_URL, ScratchDatabase
from bench.pgbench_script import Transaction
from bench.statement_log import log_window, parse
from saga import HandlerContext, Service
from saga.broker.transport import BrokerConfig, Topology
from saga.consumers import ConsumerOptions, ServiceRunner
from saga.messaging.envelope import (
    CONTENT_ENCODING,
    CONTENT_TYPE,
    IDEMPOTENCY_KEY_HEADER,
    Envelope,
)

#: The handler's own statement names this table; every other statement is the framework's.
BUSINESS_TABLE = "public.lone_business"
#: The consumer's idle wake-up (when it deletes what it published) stays out of the window.
IDLE_POLL = 5.0


class Reserve(BaseModel):
    key: str


class Reserved(BaseModel):
    key: str


participant = Service("lone_participant")


@participant.handler(Reserve)
def reserve(tx: psycopg.Connection[Any], command: Reserve, ctx: HandlerContext) -> Reserved:
    tx.execute(f"UPDATE {BUSINESS_TABLE} SET n = n + 1 WHERE id = 1")
    return Reserved(key=command.key)


@dataclass(frozen=True, slots=True)
class LoneDelivery:
    """The framework's statements for one delivery, as the server received them."""

    #: the delivery's transaction, BEGIN to COMMIT, the handler's statements left out
    transaction: list[str]
    #: every statement after that transaction until the reply was on the broker
    publishing: list[str]

    @property
    def commands(self) -> int:
        return len(self.transaction) + len(self.publishing)


def split(transactions: list[Transaction], message_id: str, business: str) -> LoneDelivery:
    """The delivery naming ``message_id`` among the ``transactions`` logged, and what the
    same database received after it; statements naming ``business`` are the handler's."""
    named = [tx for tx in transactions if message_id in tx.text()]
    if len(named) != 1:
        raise RuntimeError(f"{len(named)} transactions name message {message_id}, not one")
    after = transactions[transactions.index(named[0]) + 1 :]
    return LoneDelivery(
        [s.sql for s in named[0].statements if business not in s.sql],
        [s.sql for tx in after for s in tx.statements],
    )


def measure(broker_url: str = AMQP_URL, timeout: float = 30.0) -> LoneDelivery:
    """Run one lone delivery through a real consumer and count what PostgreSQL received."""
    database = ScratchDatabase.create("saga_bench_lone_delivery", log_statements=True)
    topology = Topology(queue_prefix=f"bench_lone_{uuid.uuid4().hex[:8]}.")
    queues = [topology.queue_name(participant.name), topology.queue_name("requester")]
    runner = ServiceRunner(
        participant,
        database.url,
        BrokerConfig(broker_url),
        ConsumerOptions(poll_timeout=IDLE_POLL),
        topology,
    )
    try:
        with psycopg.connect(database.url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {BUSINESS_TABLE} (id int PRIMARY KEY, n int)")
            conn.execute(f"INSERT INTO {BUSINESS_TABLE} VALUES (1, 0)")
        runner.start()
        if not runner.wait_ready(timeout):
            raise RuntimeError("the participant did not start consuming")
        command = Envelope.wrap(
            Reserve(key="alone"), reply_to="requester", headers={IDEMPOTENCY_KEY_HEADER: "k"}
        )
        with Connection(broker_url) as broker:
            channel = broker.channel()
            replies = topology.queue("requester")(channel)
            replies.declare()
            with log_window(ADMIN_URL, [database.name]) as lines:
                Producer(channel).publish(
                    command.to_bytes(),
                    routing_key=queues[0],
                    content_type=CONTENT_TYPE,
                    content_encoding=CONTENT_ENCODING,
                )
                _wait_for_reply(replies, timeout)
    finally:
        runner.stop(30)
        database.drop()
        with Connection(broker_url) as broker:
            channel = broker.channel()
            for name in queues:
                channel.queue_delete(name)
    return split(parse(lines), str(command.message_id), BUSINESS_TABLE)


def _wait_for_reply(queue: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while queue.get(no_ack=True) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no reply within {timeout:.0f}s")
        time.sleep(0.01)  # polling the broker for the reply, as a client would


if __name__ == "__main__":
    found = measure()
    print(f"{found.commands} framework commands: {found.transaction} + {found.publishing}")
