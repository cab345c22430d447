"""What a delivery that arrives alone costs, counted from what PostgreSQL received.

The test database logs every statement (``log_statement = 'all'`` on it alone); one
forward command with a step key and a reply address goes to an idle consumer, and the
server's log is read from the moment it is published until its reply is on the broker.
The handler's own statement aside, the delivery's transaction must hold at most four
framework commands, and publishing the reply after commit none at all.
"""

from __future__ import annotations

import re
from pathlib import Path

from psycopg import sql
from pydantic import BaseModel

from bench.lone_delivery import split
from bench.statement_log import log_window, parse
from saga import Saga, SagaRegistry
from saga.consumers import Delivery, DeliveryBatchProcessor, DeliveryOutcome
from saga.messaging.envelope import IDEMPOTENCY_KEY_HEADER, Envelope
from saga.messaging.leases import Leases, leasing
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase, with_database
from tests.support.running import running_service, saga_system_running
from tests.support.services import EFFECTS_DDL, Ping, Pong, service
from tests.support.wait import wait_until

JSON = "application/json"
REPLIES = "lone-replies"
#: The consumer's idle wake-up (when it deletes the rows it published) falls outside the
#: counted window: the window closes as soon as the reply is on the broker.
IDLE_POLL = 5.0


def test_a_lone_delivery_costs_at_most_four_framework_commands_and_none_to_publish(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    db.execute(EFFECTS_DDL)
    db.execute(
        sql.SQL("ALTER DATABASE {} SET log_statement = 'all'")  # type: ignore[arg-type]
        .format(sql.Identifier(db.name))
        .as_string()
    )
    rabbit.declare(REPLIES)
    command = Envelope.wrap(
        Ping(key="alone"), reply_to=REPLIES, headers={IDEMPOTENCY_KEY_HEADER: "step-alone"}
    )
    with (
        running_service(service, db, rabbit, poll_timeout=IDLE_POLL),
        log_window(with_database(db.url, "postgres"), [db.name]) as lines,
    ):
        rabbit.publish_raw(service.name, command.to_bytes(), JSON)
        wait_until(lambda: rabbit.queue_depth(REPLIES) == 1, what="the reply published")
    found = split(parse(lines), str(command.message_id), "public.effects")
    counts = (len(found.transaction), len(found.publishing))
    assert counts[0] <= 4 and counts[1] == 0, (counts, found)
    assert found.transaction[0] == "BEGIN" and found.transaction[-1] == "COMMIT", found


class Trip(BaseModel):
    key: str


two_hops = Saga("two_hops", data=Trip)
two_hops.remote("first", service=service.name, command=lambda d: Ping(key=d.key), reply=Pong)
two_hops.remote("second", service=service.name, command=lambda d: Ping(key=d.key, n=1))
hops = SagaRegistry("lone_hops")
hops.register(two_hops)


def test_a_reply_alone_reads_its_saga_with_the_inbox_and_moves_it_in_one_statement(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """The saga's home handling a reply alone: four framework commands, BEGIN, the inbox
    row with the saga's row read, the saga row with its step log and its next command (one
    statement), COMMIT. The three writes were three statements, and a closing statement
    checked that the command's row, leased at the top level of the transaction, was still
    there; another deleted the rows published after the commits before, and another read
    the saga's row."""
    db.execute(EFFECTS_DDL)
    db.execute(
        sql.SQL("ALTER DATABASE {} SET log_statement = 'all'")  # type: ignore[arg-type]
        .format(sql.Identifier(db.name))
        .as_string()
    )
    with (
        saga_system_running(db, rabbit, hops, service),
        log_window(with_database(db.url, "postgres"), [db.name]) as lines,
    ):
        with db.connect(autocommit=False) as conn, conn.transaction():
            saga_id = hops.start(conn, two_hops, Trip(key="alone"))
        wait_until(
            lambda: db.scalar("SELECT status FROM saga.saga_instances") == "completed",
            what="the saga completed",
        )
    moving = [t for t in parse(lines) if str(saga_id) in t.text() and "saga_steps" in t.text()]
    reply = next(t for t in moving if "inbox" in t.text() and "Ping" in t.text())
    sqls = [s.sql for s in reply.statements]
    assert len(sqls) <= 4, sqls
    assert any("fresh AS" in s and "saga_instances" in s for s in sqls), sqls
    assert any("saga_instances" in s and "saga_steps" in s and "outbox" in s for s in sqls), sqls
    # The last reply's transaction deletes the row of the command the first one published
    # after its commit, in its opening statement: no statement of its own.
    last = [s.sql for s in moving[-1].statements]
    assert last[-1] == "COMMIT" and len(last) <= 4, last
    assert any("fresh AS" in s and "DELETE FROM" in s for s in last), last


def test_a_lone_delivery_begins_with_its_opening_statement_in_one_round_trip(
    db: TestDatabase, tmp_path: Path
) -> None:
    """On an autocommit connection (a worker's), BEGIN goes to the server in one pipeline
    with the opening statement: a delivery alone waits on the server four times (BEGIN
    and the opening statement, the handler's statement, the closing statement with its
    reply, COMMIT), where BEGIN had a round trip of its own. Counted from the protocol
    messages the client library traced: each wait ends with the server's ReadyForQuery.
    A first delivery prepares the statements (preparing costs round trips once)."""
    db.execute(EFFECTS_DDL)
    processor = DeliveryBatchProcessor(service)
    traced = tmp_path / "protocol.trace"
    outcomes = []
    with db.connect() as conn, leasing(Leases()), traced.open("w") as trace:
        for key in ("warm", "trips"):
            command = Envelope.wrap(
                Ping(key=key), reply_to=REPLIES, headers={IDEMPOTENCY_KEY_HEADER: f"step-{key}"}
            )
            if key == "trips":
                conn.pgconn.trace(trace.fileno())
            outcomes += processor.process(conn, [Delivery(command.to_bytes(), JSON)])
        conn.pgconn.untrace()
    assert outcomes == [DeliveryOutcome.HANDLED] * 2
    assert db.scalar("SELECT count(*) FROM effects WHERE key = 'trips'") == 1
    protocol = traced.read_text()
    assert len(re.findall(r"\tB\t\d+\tReadyForQuery\t", protocol)) == 4, protocol
