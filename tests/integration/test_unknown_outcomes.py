"""Steps whose outcome is unknown: compensated too or held, closed where they were undone.

A command that a participant dead-lettered after technical failures (or that got
no reply before its deadline) may have had its effect. The saga compensates that
step too, or holds it for the operator; the participant records the compensated
step as closed and never runs its command afterwards; a success that arrives
after the saga compensated past its step is undone.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from kombu import Connection
from pydantic import BaseModel

from saga import HandlerContext, Saga, SagaRegistry, Service, Tx
from saga.messaging.control import DEAD_LETTERED, Ack, FailureReply
from saga.messaging.dead_letters import DeadLetter, DeadLetterFilter, DeadLetterStore
from saga.messaging.envelope import COMPENSATES_HEADER, STEP_HEADER, Envelope
from saga.operations.replay import purge, superseded
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.running import running_relay, running_service
from tests.support.sagas import FAST
from tests.support.services import EFFECTS_DDL
from tests.support.wait import wait_until


class StashData(BaseModel):
    item_id: str


class LockItem(BaseModel):
    item_id: str


class ItemLocked(BaseModel):
    lock_id: str


class UnlockItem(BaseModel):
    item_id: str


def _saga(name: str, **step: Any) -> tuple[Saga[StashData], SagaRegistry]:
    saga = Saga(name, data=StashData)
    saga.remote(
        "lock_item",
        service="vault",
        command=LockItem,
        reply=ItemLocked,
        compensate=UnlockItem,
        **step,
    )
    registry = SagaRegistry("stash", retry=FAST)
    registry.register(saga)
    return saga, registry


vault = Service("vault", retry=FAST)


@vault.handler(LockItem)
def lock_item(tx: Tx, cmd: LockItem, ctx: HandlerContext) -> ItemLocked:
    tx.execute("INSERT INTO effects (kind, key) VALUES ('lock', %s)", (ctx.idempotency_key,))
    return ItemLocked(lock_id=ctx.idempotency_key)


@vault.handler(UnlockItem)
def unlock_item(tx: Tx, cmd: UnlockItem, ctx: HandlerContext) -> None:
    locked = tx.execute(
        "SELECT 1 FROM effects WHERE kind = 'lock' AND key = %s", (ctx.compensated_key,)
    ).fetchone()
    if locked:  # nothing to undo when the command never ran
        tx.execute("INSERT INTO effects (kind, key) VALUES ('unlock', %s)", (ctx.compensated_key,))


def _start(db: TestDatabase, saga: Saga[StashData], item: str) -> UUID:
    with db.connect(autocommit=False) as conn, conn.transaction():
        return saga.start(conn, StashData(item_id=item))


def _status(db: TestDatabase, saga_id: UUID) -> str:
    return str(db.scalar("SELECT status FROM saga.saga_instances WHERE id = %s", (saga_id,)))


def _sent(db: TestDatabase, saga_id: UUID) -> list[Envelope]:
    """The messages the saga has queued, oldest first (nothing relays them in these tests)."""
    bodies = db.rows(
        "SELECT body FROM saga.outbox WHERE saga_id = %s AND destination = 'vault' ORDER BY id",
        (saga_id,),
    )
    return [Envelope.from_bytes(bytes(row[0])) for row in bodies]


def _answer(db: TestDatabase, registry: SagaRegistry, request: Envelope, reply: BaseModel) -> None:
    """Feed the orchestrator the reply ``request``'s participant would send."""
    headers = {k: v for k in (STEP_HEADER, COMPENSATES_HEADER) if (v := request.headers.get(k))}
    envelope = Envelope.wrap(
        reply, saga_id=request.saga_id, causation_id=request.message_id, headers=headers
    )
    with db.connect(autocommit=False) as conn, conn.transaction():
        registry.orchestrator.on_reply(conn, reply, envelope)


def _timeline(db: TestDatabase, saga_id: UUID) -> list[tuple[str, str, str]]:
    rows = db.rows(
        "SELECT step, phase, outcome FROM saga.saga_steps WHERE saga_id = %s ORDER BY id",
        (saga_id,),
    )
    return [(r[0], r[1], r[2]) for r in rows]


def test_a_dead_lettered_step_is_compensated_too_and_a_late_success_undone(
    db: TestDatabase,
) -> None:
    saga, registry = _saga("stash_compensating")
    saga_id = _start(db, saga, "i1")
    [command] = _sent(db, saga_id)
    failure = FailureReply(reason="gave up", code=DEAD_LETTERED, failed_type="LockItem")
    _answer(db, registry, command, failure)
    command, compensation = _sent(db, saga_id)
    assert compensation.type == "UnlockItem"
    assert compensation.headers[COMPENSATES_HEADER] == f"{saga_id}:lock_item"
    _answer(db, registry, compensation, Ack())
    assert _status(db, saga_id) == "compensated"
    # the command ran after all (its participant keeps no closed-step record): undo it
    _answer(db, registry, command, ItemLocked(lock_id="l-1"))
    late = _sent(db, saga_id)[-1]
    assert (late.type, late.headers[COMPENSATES_HEADER]) == ("UnlockItem", f"{saga_id}:lock_item")
    assert _timeline(db, saga_id)[-1] == ("lock_item", "forward", "late_success")
    assert _status(db, saga_id) == "compensating"  # until that compensation answers
    _answer(db, registry, late, Ack())
    assert len(_sent(db, saga_id)) == 3
    assert _timeline(db, saga_id)[-1] == ("lock_item", "compensation", "succeeded")
    assert _status(db, saga_id) == "compensated"


def test_a_held_step_waits_for_the_operator_and_a_purge_compensates_it(
    db: TestDatabase,
) -> None:
    saga, registry = _saga("stash_holding", on_dead_letter="hold")
    saga_id = _start(db, saga, "i2")
    [command] = _sent(db, saga_id)
    failure = FailureReply(reason="gave up", code=DEAD_LETTERED, failed_type="LockItem")
    _answer(db, registry, command, failure)
    assert _status(db, saga_id) == "step_dead_lettered"
    assert _timeline(db, saga_id)[-1] == ("lock_item", "forward", "held")
    assert len(_sent(db, saga_id)) == 1  # nothing compensated yet
    store = DeadLetterStore("saga")
    with db.connect(autocommit=False) as conn:
        with conn.transaction():
            store.add(
                conn,
                DeadLetter(
                    consumer="vault", reason="failed", body=command.to_bytes(),
                    error_type="TimeoutError", error_message="gateway down",
                    message_id=command.message_id, saga_id=saga_id, destination="vault",
                ),
            )  # fmt: skip
        letters = store.find(conn, DeadLetterFilter(consumer="vault"))
        assert purge(conn, letters) == 1
    [answer] = [
        Envelope.from_bytes(bytes(row[0]))
        for row in db.rows("SELECT body FROM saga.outbox WHERE destination = 'stash'")
    ]
    assert (answer.causation_id, answer.payload["code"]) == (command.message_id, "purged")
    with db.connect(autocommit=False) as conn, conn.transaction():
        reply = FailureReply.model_validate(answer.payload)
        registry.orchestrator.on_reply(conn, reply, answer)
    assert _status(db, saga_id) == "compensating"
    compensation = _sent(db, saga_id)[-1]
    assert compensation.headers[COMPENSATES_HEADER] == f"{saga_id}:lock_item"


def test_a_compensation_that_overtakes_its_command_closes_the_step(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    db.execute(EFFECTS_DDL)
    saga, registry = _saga(
        "stash_deadline", deadline=timedelta(seconds=0.3), on_deadline="compensate"
    )
    rabbit.use("vault")
    with running_relay(db, rabbit), running_service(registry.as_service(), db, rabbit):
        saga_id = _start(db, saga, "i3")
        command = _take(rabbit, "vault")  # the command is held up on its way...
        assert command.type == "LockItem"
        wait_until(lambda: _status(db, saga_id) == "compensating", what="deadline passed")
        # ...and arrives after its compensation
        rabbit.publish_raw("vault", command.to_bytes(), "application/json")
        with running_service(vault, db, rabbit):
            wait_until(lambda: _status(db, saga_id) == "compensated", what="saga compensated")
            wait_until(
                lambda: db.scalar("SELECT count(*) FROM saga.inbox WHERE consumer = 'vault'") == 2,
                what="both messages handled",
            )
            wait_until(
                lambda: ("lock_item", "forward", "ignored") in _timeline(db, saga_id),
                what="the refusal reached the saga",
            )
    assert db.rows("SELECT kind FROM effects") == []  # the command never ran
    key = db.scalar("SELECT step_key FROM saga.closed_steps")
    assert key == f"{saga_id}:lock_item"
    refusal = db.scalar(
        "SELECT error FROM saga.saga_steps WHERE saga_id = %s AND outcome = 'ignored'", (saga_id,)
    )
    assert "step_closed" in refusal
    letter = DeadLetter(
        consumer="vault", reason="failed", body=command.to_bytes(), error_type="E",
        error_message="m", destination="vault",
    )  # fmt: skip
    with db.connect(autocommit=False) as conn:
        with conn.transaction():
            letter_id = DeadLetterStore("saga").add(conn, letter)
        rows = DeadLetterStore("saga").find(conn, DeadLetterFilter(ids=[letter_id]))
        assert "superseded" in superseded(conn, rows)[letter_id]


def _take(broker: TestBroker, destination: str) -> Envelope:
    """Take the next message off a destination's queue, bypassing every consumer."""
    with Connection(broker.url) as conn:
        queue = broker.topology.queue(destination)(conn.channel())
        queue.declare()
        message = wait_until(lambda: queue.get(no_ack=True), what=f"a message for {destination}")
        return Envelope.from_bytes(message.body)
