"""A parallel group, event by event: one transition sends every member's command, the saga
goes on when all have answered, and a pivot inside a group is refused at registration."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

import pytest
from pydantic import BaseModel

from saga import Saga
from saga.engine.fingerprints import shape
from saga.engine.state import SagaRecord, SagaStatus
from saga.engine.transitions import Transition
from saga.errors import ConfigurationError
from saga.messaging.control import Ack, FailureReply
from saga.messaging.envelope import COMPENSATES_HEADER, STEP_HEADER, Envelope
from saga.testing import SagaScenario
from tests.support.group_order import Order, Reserve, Reserved, order_saga
from tests.support.saga_model import MemorySteps

SAGA_ID = UUID(int=1)
AT = datetime(2025, 1, 1, tzinfo=UTC)


class Run:
    """One saga instance moved by transitions, as the orchestrator would."""

    def __init__(self, saga: Saga[Order]) -> None:
        saga.validate()
        self.saga = saga
        self.record = SagaRecord.new(SAGA_ID, "order", 1, "home", Order().model_dump())
        self.sent: list[list[Envelope]] = []
        self.step(None, lambda t: t.advance(0))

    def step(self, cause: Envelope | None, event: object) -> None:
        run = Transition(self.saga, self.record, cause=cause, at=AT, home_service="home",
                         local_steps=MemorySteps(AT))  # fmt: skip
        event(run)  # type: ignore[operator]
        result = run.result()
        self.record = result.record
        self.sent.append([m.envelope for m in result.outgoing])

    def answer(self, request: Envelope, reply: BaseModel) -> None:
        headers = {k: v for k in (STEP_HEADER, COMPENSATES_HEADER) if (v := request.headers.get(k))}
        envelope = Envelope.wrap(reply, saga_id=SAGA_ID, causation_id=request.message_id,
                                 headers=headers)  # fmt: skip
        if isinstance(reply, FailureReply):
            self.step(envelope, lambda t: t.on_failure(reply))
        else:
            self.step(envelope, lambda t: t.on_success(reply))


def steps_of(envelopes: list[Envelope]) -> list[str]:
    return [e.headers[STEP_HEADER] for e in envelopes]


def test_every_member_is_sent_in_one_transition_and_the_saga_goes_on_when_all_answered() -> None:
    run = Run(order_saga())
    [create] = run.sent[-1]
    run.answer(create, Ack())
    members = run.sent[-1]
    assert steps_of(members) == ["reserve_stock", "reserve_credit"]
    assert run.record.step == "reserve"
    run.answer(members[1], Reserved(reference="c-1"))
    assert run.sent[-1] == [] and run.record.step == "reserve"  # still waiting for stock
    run.answer(members[0], Reserved(reference="s-1"))
    assert steps_of(run.sent[-1]) == ["charge"]
    assert run.record.data == {"stock": "s-1", "credit": "c-1"}
    assert run.record.completed_steps == ["create", "reserve_credit", "reserve_stock"]
    assert run.record.step_state == {}


def test_a_failed_member_compensates_its_succeeded_sibling_and_the_steps_before() -> None:
    run = Run(order_saga())
    run.answer(run.sent[-1][0], Ack())
    stock, credit = run.sent[-1]
    run.answer(stock, Reserved(reference="s-1"))
    run.answer(credit, FailureReply(reason="no credit", failed_type="Reserve"))
    assert run.record.status is SagaStatus.COMPENSATING
    [undo_stock] = run.sent[-1]
    assert undo_stock.headers[COMPENSATES_HEADER].endswith(":reserve_stock")
    run.answer(undo_stock, Ack())
    [undo_create] = run.sent[-1]
    assert undo_create.headers[COMPENSATES_HEADER].endswith(":create")
    run.answer(undo_create, Ack())
    assert run.record.status is SagaStatus.COMPENSATED


def test_a_resume_sends_the_members_still_out_again_under_their_own_ids() -> None:
    run = Run(order_saga())
    run.answer(run.sent[-1][0], Ack())
    stock, credit = run.sent[-1]
    run.answer(stock, Reserved(reference="s-1"))
    run.step(None, lambda t: t.resume())
    [again] = run.sent[-1]
    assert (again.message_id, steps_of([again])) == (credit.message_id, ["reserve_credit"])
    run.answer(again, Reserved(reference="c-1"))
    assert steps_of(run.sent[-1]) == ["charge"]


def test_a_pivot_inside_a_group_is_refused_at_registration() -> None:
    with pytest.raises(ConfigurationError, match="a pivot may not sit inside a group"):
        order_saga(pivot=True).validate()


def test_a_wait_cannot_be_a_member() -> None:
    saga = Saga("order", data=Order)
    refused = pytest.raises(ConfigurationError, match="cannot be a member of a parallel group")
    with refused, saga.parallel("reserve"):
        saga.wait("approval", event="approved", payload=Reserved)


def test_a_version_that_drops_a_member_cannot_take_sagas_that_may_be_inside_the_group() -> None:
    older = order_saga()
    newer = Saga("order", data=Order, version=2)
    newer.remote("create", service="orders", command=lambda d: Reserve(what="order"))
    with newer.parallel("reserve"):
        newer.remote("reserve_stock", service="inventory", command=lambda d: Reserve(what="s"))
    newer.remote("charge", service="payments", command=lambda d: Reserve(what="charge"))
    newer.migrate_from(1, unless_passed="reserve")
    with pytest.raises(ConfigurationError, match=r"lacks their steps \['reserve_credit'\]"):
        newer.validate_migration(older)


def test_a_scenario_takes_the_members_commands_in_any_order() -> None:
    s = SagaScenario(order_saga(), Order())
    s.expect_command("orders", Reserve(what="order")).reply()
    s.expect_command("customers", Reserve(what="credit")).reply(Reserved(reference="c-1"))
    s.expect_command("inventory", Reserve(what="stock")).reply(Reserved(reference="s-1"))
    s.expect_command("payments", Reserve(what="charge")).reply()
    s.run_until_idle()
    assert s.record.status is SagaStatus.COMPLETED
    assert s.record.data == {"stock": "s-1", "credit": "c-1"}


def test_the_shape_of_a_group_names_its_members() -> None:
    [_, group, _] = shape(order_saga())
    assert group["kind"] == "parallel"
    assert [m["step"] for m in group["members"]] == ["reserve_stock", "reserve_credit"]


def sequential_saga() -> Saga[Order]:
    """``order_saga`` before its reservations became a group: stock, then credit."""
    saga = Saga("order", data=Order)
    saga.remote("create", service="orders", command=lambda d: Reserve(what="order"))
    saga.remote("reserve_stock", service="inventory", command=lambda d: Reserve(what="stock"))
    saga.remote("reserve_credit", service="customers", command=lambda d: Reserve(what="credit"))
    saga.remote("charge", service="payments", command=lambda d: Reserve(what="charge"))
    return saga


def test_sagas_at_a_step_that_became_a_member_are_refused_clearly() -> None:
    newer = order_saga()
    newer.version = 2
    newer.migrate_from(1, unless_passed="reserve_credit")
    refused = r"step 'reserve_stock' of v1 is a member of group 'reserve' here"
    with pytest.raises(ConfigurationError, match=refused):
        newer.validate_migration(sequential_saga())


def test_sagas_inside_a_group_whose_members_changed_are_refused_clearly() -> None:
    older = Saga("order", data=Order)
    older.remote("create", service="orders", command=lambda d: Reserve(what="order"))
    with older.parallel("reserve"):
        older.remote("reserve_stock", service="inventory", command=lambda d: Reserve(what="s"))
    older.remote("reserve_credit", service="customers", command=lambda d: Reserve(what="c"))
    newer = order_saga()
    newer.version = 2
    newer.migrate_from(1, unless_passed="reserve")
    refused = (
        r"group 'reserve' has members \['reserve_stock'\] in v1 "
        r"but \['reserve_stock', 'reserve_credit'\] here"
    )
    with pytest.raises(ConfigurationError, match=refused):
        newer.validate_migration(older)


def test_sagas_that_passed_the_regrouped_steps_still_migrate() -> None:
    newer = order_saga()
    newer.version = 2
    newer.migrate_from(1, unless_passed="create")
    newer.validate_migration(sequential_saga())  # only sagas at "create" may move: same step
