"""A fan-out inside a parallel group, event by event: its first items leave with the other
members, the group waits for every item, an item or a sibling that fails compensates what
took effect (items whose success comes late included, undone once; up to max_in_flight
item compensations out at once, each retried on its own), a resume sends every member
and item still out again, and a fan-out member that is the pivot is refused."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from pydantic import BaseModel

from saga import Saga, StepRetry
from saga.engine.fingerprints import shape
from saga.engine.steps import ForEach, ParallelGroup
from saga.errors import ConfigurationError
from saga.messaging.control import DEAD_LETTERED, FailureReply
from saga.messaging.envelope import COMPENSATES_HEADER
from saga.testing import SagaScenario
from saga.testing.messages import Message
from tests.support.group_order import Reserved
from tests.support.order_lines import CancelOrder, CreateOrder, Order, ReleaseLine, lines


class ReserveLine(BaseModel):
    """Only the sku: these tests match its payload to ``{"sku": ...}``."""

    sku: str


class ReserveCredit(BaseModel):
    pass


class ReleaseCredit(BaseModel):
    pass


def order_saga(*, cap: int = 2, retry: StepRetry | None = None) -> Saga[Order]:
    saga = Saga("order", data=Order)
    saga.remote("create", service="orders", command=CreateOrder, compensate=CancelOrder)
    with saga.parallel("reserve"):
        saga.for_each(
            "reserve_lines",
            items=lambda d: d.lines,
            service="stock",
            command=lambda d, line: ReserveLine(sku=line.sku),
            reply=Reserved,
            on_reply=lambda d, line, r: d.model_copy(
                update={"reserved": {**d.reserved, line.sku: r.reference}}
            ),
            compensate=lambda d, line: ReleaseLine(sku=line.sku),
            max_in_flight=cap,
            key=lambda line: line.sku,
            retry=retry,
        )
        saga.remote(
            "reserve_credit",
            service="customers",
            command=ReserveCredit,
            reply=Reserved,
            on_reply=lambda d, r: d.model_copy(update={"credit": r.reference}),
            compensate=ReleaseCredit,
        )
    saga.remote("charge", service="payments", command=CreateOrder)
    saga.validate()
    return saga


def reserving(*skus: str, retry: StepRetry | None = None) -> SagaScenario:
    """A saga whose order was created: at the group, its first items and credit out."""
    scenario = SagaScenario(order_saga(retry=retry), lines(*skus))
    scenario.expect_command("orders", CreateOrder()).reply(Reserved())
    scenario.run_until_idle()
    return scenario


def reserve(scenario: SagaScenario, sku: str) -> Message:
    """The command reserving ``sku``, still unanswered."""
    [command] = [m for m in scenario.sent_to("stock") if m.payload == {"sku": sku}
                 and m.type.endswith("ReserveLine")]  # fmt: skip
    return command


def credit(scenario: SagaScenario) -> Message:
    return scenario.sent_to("customers")[0]


def released(scenario: SagaScenario) -> list[str]:
    """The skus whose reservation was undone, in the order the releases were sent."""
    return [m.payload["sku"] for m in scenario.sent_to("stock") if m.type.endswith("ReleaseLine")]


def credit_releases(scenario: SagaScenario) -> int:
    return len([m for m in scenario.sent_to("customers") if m.type.endswith("ReleaseCredit")])


def test_the_first_items_leave_with_the_sibling_and_the_saga_goes_on_when_all_answered() -> None:
    scenario = reserving("a", "b", "c")
    assert [m.payload for m in scenario.sent_to("stock")] == [{"sku": "a"}, {"sku": "b"}]
    assert len(scenario.sent_to("customers")) == 1  # in the same transition as the items
    state = scenario.record.step_state
    assert state["members"]["reserve_lines"]["marks"] == ">>."  # compact: a mark an item
    assert len(state["awaits"]) == 3 and scenario.record.waiting_on == [
        "reserve_lines",
        "reserve_credit",
    ]
    scenario.answer(reserve(scenario, "b"), Reserved(reference="rb"))
    scenario.answer(credit(scenario), Reserved(reference="cr"))
    scenario.run_until_idle()
    assert scenario.step == "reserve"  # a and c are still out
    assert scenario.record.completed_steps == ["create", "reserve_lines", "reserve_credit"]
    scenario.answer(reserve(scenario, "a"), Reserved(reference="ra"))
    scenario.run_until_idle()
    assert scenario.sent_to("payments") == []
    scenario.answer(reserve(scenario, "c"), Reserved(reference="rc"))
    charge = scenario.expect_command("payments", CreateOrder())
    # done last: undone first, as the step log shows it succeeded last
    assert scenario.record.completed_steps == ["create", "reserve_credit", "reserve_lines"]
    charge.reply(Reserved())
    scenario.run_until_idle()
    assert scenario.status == "completed"
    assert scenario.data == Order(
        lines=scenario.data.lines,  # type: ignore[attr-defined]
        reserved={"a": "ra", "b": "rb", "c": "rc"},
        credit="cr",
    )


def test_an_item_failing_while_the_sibling_is_out_compensates_at_once() -> None:
    scenario = reserving("a", "b", "c")
    scenario.answer(reserve(scenario, "a"), Reserved(reference="ra"))
    scenario.run_until_idle()
    scenario.expect_command("stock", ReserveLine(sku="b")).fail("out of stock")
    scenario.run_until_idle()
    assert scenario.status == "compensating"  # c and the credit are no longer awaited
    assert released(scenario) == ["a"]
    assert scenario.record.last_error == "reserve_lines[1]: out of stock"
    # c succeeds while a's release is out: the fan-out undoes it next
    scenario.answer(reserve(scenario, "c"), Reserved(reference="rc"))
    scenario.run_until_idle()
    scenario.expect_command("stock", ReleaseLine(sku="a")).reply(Reserved())
    scenario.expect_command("stock", ReleaseLine(sku="c")).reply(Reserved())
    scenario.run_until_idle()
    # the credit's success comes once the saga compensated past the group: undone too
    scenario.expect_command("orders", CancelOrder()).reply(Reserved())
    scenario.answer(credit(scenario), Reserved(reference="cr"))
    scenario.run_until_idle()
    scenario.expect_command("customers", ReleaseCredit()).reply(Reserved())  # awaited
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert released(scenario) == ["a", "c"]
    assert credit_releases(scenario) == 1


def test_a_sibling_failing_while_items_are_out_undoes_only_the_items_that_succeed_late() -> None:
    scenario = reserving("a", "b", "c")
    scenario.expect_command("customers", ReserveCredit()).fail("no credit")
    scenario.expect_command("orders", CancelOrder()).reply(Reserved())
    scenario.run_until_idle()
    assert scenario.status == "compensated"  # no item had taken effect
    assert released(scenario) == []
    scenario.answer(reserve(scenario, "a"), Reserved(reference="ra"))  # late success
    scenario.answer(reserve(scenario, "b"), Reserved(reference="rb"))
    scenario.run_until_idle()
    # the fan-out is undone again, for a; b, late while a's release is out, follows it
    assert scenario.status == "compensating"
    assert released(scenario) == ["a"]
    assert scenario.steps.count("reserve_lines late_success") == 2
    scenario.expect_command("stock", ReleaseLine(sku="a")).reply(Reserved())
    scenario.expect_command("stock", ReleaseLine(sku="b")).reply(Reserved())
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert released(scenario) == ["a", "b"]
    scenario.answer(reserve(scenario, "a"), Reserved(reference="ra"))  # a duplicate
    scenario.run_until_idle()
    assert released(scenario) == ["a", "b"]  # undone once
    assert "members" not in scenario.record.step_state  # nothing is out any more
    assert [m for m in scenario.sent_to("stock") if m.payload == {"sku": "c"}] == []
    assert credit_releases(scenario) == 0


def test_an_item_succeeding_after_the_fan_outs_compensation_is_undone_alone_and_awaited() -> None:
    scenario = reserving("a", "b", "c", retry=StepRetry(attempts=2))
    scenario.answer(reserve(scenario, "a"), Reserved(reference="ra"))  # c leaves now
    scenario.run_until_idle()
    scenario.expect_command("customers", ReserveCredit()).fail("no credit")
    scenario.expect_command("stock", ReleaseLine(sku="a")).reply(Reserved())
    scenario.expect_command("orders", CancelOrder()).reply(Reserved())
    scenario.run_until_idle()
    assert scenario.status == "compensated"  # b and c still out
    scenario.answer(reserve(scenario, "c"), Reserved(reference="rc"))
    scenario.run_until_idle()
    assert scenario.status == "compensating"  # the fan-out again, for c alone
    assert released(scenario) == ["a", "c"]
    assert scenario.record.step_state["members"]["reserve_lines"]["marks"] == "-><"
    scenario.expect_command("stock", ReleaseLine(sku="c")).fail("stock service busy")
    scenario.run_until_idle()
    scenario.advance(timedelta(minutes=5))  # its retry timer
    scenario.expect_command("stock", ReleaseLine(sku="c")).fail("no such reservation")
    scenario.run_until_idle()
    assert scenario.status == "compensation_failed"
    assert scenario.record.last_error == "reserve_lines[2]: no such reservation"
    assert scenario.resume()
    scenario.expect_command("stock", ReleaseLine(sku="c")).reply(Reserved())
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert released(scenario) == ["a", "c", "c", "c"]  # a, undone before, not again
    assert scenario.record.step_state["members"]["reserve_lines"]["out"]  # b: still out
    scenario.answer(reserve(scenario, "b"), Reserved(reference="rb"))
    scenario.on("stock", ReleaseLine, Reserved())
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert released(scenario) == ["a", "c", "c", "c", "b"]
    assert "members" not in scenario.record.step_state  # nothing is out any more
    assert credit_releases(scenario) == 0


def test_an_item_succeeding_late_before_the_fan_outs_turn_is_undone_with_the_others() -> None:
    scenario = reserving("a", "b", "c")
    scenario.answer(reserve(scenario, "a"), Reserved(reference="ra"))  # c leaves now
    scenario.answer(credit(scenario), Reserved(reference="cr"))
    scenario.run_until_idle()
    scenario.expect_command("stock", ReserveLine(sku="b")).fail("out of stock")
    scenario.run_until_idle()
    assert credit_releases(scenario) == 1 and released(scenario) == []  # latest first
    scenario.answer(reserve(scenario, "c"), Reserved(reference="rc"))  # late, not yet undone
    scenario.run_until_idle()
    assert released(scenario) == []
    scenario.expect_command("customers", ReleaseCredit()).reply(Reserved())
    scenario.expect_command("stock", ReleaseLine(sku="c")).reply(Reserved())
    scenario.expect_command("stock", ReleaseLine(sku="a")).reply(Reserved())
    scenario.expect_command("orders", CancelOrder()).reply(Reserved())
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert released(scenario) == ["c", "a"]
    keys = [m.envelope.headers[COMPENSATES_HEADER].rsplit(":", 2)[1:] for m in
            scenario.sent_to("stock") if m.type.endswith("ReleaseLine")]  # fmt: skip
    assert keys == [["2", "c"], ["0", "a"]]  # each under its item's key


def charge_failing(*skus: str, retry: StepRetry | None = None) -> SagaScenario:
    """A saga whose group succeeded, the fan-out last, and whose charge then failed: the
    fan-out member is undoing its items."""
    scenario = reserving(*skus, retry=retry)
    scenario.expect_command("customers", ReserveCredit()).reply(Reserved(reference="cr"))
    scenario.on("stock", ReserveLine, Reserved(reference="r"))
    scenario.expect_command("payments", CreateOrder()).fail("declined")
    scenario.run_until_idle()
    assert scenario.record.completed_steps == ["create", "reserve_credit", "reserve_lines"]
    return scenario


def test_a_fan_out_member_undoes_its_items_up_to_the_cap_at_once_in_any_order() -> None:
    scenario = charge_failing("a", "b", "c")
    assert released(scenario) == ["c", "b"]  # latest first, two out
    assert scenario.step == "reserve_lines"
    state = scenario.record.step_state["members"]["reserve_lines"]
    assert state["marks"] == "+<<"  # its state stays under its name in the group's
    assert sorted(state["awaits"].values()) == [[1, 1], [2, 1]]  # position and attempt
    assert "awaits" not in scenario.record.step_state
    assert scenario.record.waiting_on == ["reserve_lines"]
    # b's release answers first, though the saga's pending message is c's
    scenario.expect_command("stock", ReleaseLine(sku="b")).reply(Reserved())
    scenario.run_until_idle()
    assert released(scenario) == ["c", "b", "a"]  # a took b's place
    assert scenario.record.step_state["members"]["reserve_lines"]["marks"] == "<-<"
    scenario.expect_command("stock", ReleaseLine(sku="a")).reply(Reserved())
    scenario.expect_command("stock", ReleaseLine(sku="c")).reply(Reserved())
    scenario.expect_command("customers", ReleaseCredit()).reply(Reserved())
    scenario.expect_command("orders", CancelOrder()).reply(Reserved())
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert scenario.record.step_state == {}
    assert scenario.steps.count("reserve_lines compensation succeeded") == 3


def test_a_fan_out_members_item_compensation_retries_gives_up_by_name_and_resumes() -> None:
    scenario = charge_failing("a", "b", "c", retry=StepRetry(attempts=2))
    scenario.expect_command("stock", ReleaseLine(sku="c")).fail("stock service busy")
    scenario.run_until_idle()
    [retry] = [
        message
        for message, (index, attempt) in scenario.record.step_state["members"]["reserve_lines"][
            "awaits"
        ].items()
        if index == 2
    ]
    assert scenario.record.step_state["members"]["reserve_lines"]["awaits"][retry] == [2, 2]
    scenario.advance(timedelta(minutes=5))  # c's retry timer
    assert released(scenario) == ["c", "b", "c"]
    scenario.expect_command("stock", ReleaseLine(sku="c")).fail("no such reservation")
    scenario.run_until_idle()
    assert scenario.status == "compensation_failed"
    assert scenario.record.last_error == "reserve_lines[2]: no such reservation"
    assert scenario.resume()
    scenario.on("stock", ReleaseLine, Reserved())
    scenario.on("customers", ReleaseCredit, Reserved())
    scenario.on("orders", CancelOrder, Reserved())
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert sorted(released(scenario)[3:]) == ["a", "b", "c"]  # b again (a no-op by its key)
    assert credit_releases(scenario) == 1


def test_a_fan_out_before_the_group_undoes_its_items_beside_a_members_items_still_out() -> None:
    saga = Saga("order", data=Order)
    saga.for_each("hold_lines", items=lambda d: d.lines, service="holds",
                  command=lambda d, line: ReserveLine(sku=line.sku),
                  compensate=lambda d, line: ReleaseLine(sku=line.sku),
                  key=lambda line: line.sku)  # fmt: skip
    with saga.parallel("reserve"):
        saga.for_each("reserve_lines", items=lambda d: d.lines, service="stock",
                      command=lambda d, line: ReserveLine(sku=line.sku),
                      compensate=lambda d, line: ReleaseLine(sku=line.sku),
                      key=lambda line: line.sku)  # fmt: skip
        saga.remote("reserve_credit", service="customers", command=ReserveCredit)
    scenario = SagaScenario(saga, lines("a", "b"))
    scenario.on("holds", ReserveLine, Reserved())
    scenario.expect_command("customers", ReserveCredit()).fail("no credit")
    scenario.run_until_idle()
    # the lines' reservations are still out (kept under members) while the holds are undone
    assert scenario.step == "hold_lines"
    assert scenario.record.waiting_on == ["hold_lines"]
    assert "out" in scenario.record.step_state["members"]["reserve_lines"]
    scenario.answer(reserve(scenario, "b"), Reserved())  # a late success: undone after holds
    scenario.on("holds", ReleaseLine, Reserved())
    scenario.on("stock", ReleaseLine, Reserved())
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert released(scenario) == ["b"]
    assert len([m for m in scenario.sent_to("holds") if m.type.endswith("ReleaseLine")]) == 2
    assert scenario.record.step_state["members"]["reserve_lines"]["out"]  # a: still out


def test_a_dead_lettered_item_is_undone_as_in_doubt() -> None:
    scenario = reserving("a")
    scenario.answer(reserve(scenario, "a"), Reserved(reference="ra"))
    scenario.run_until_idle()
    assert scenario.record.step_state["members"] == {
        "reserve_credit": scenario.record.step_state["members"]["reserve_credit"]
    }  # the fan-out is done: its state is gone
    scenario = reserving("a", "b")
    gave_up = FailureReply(reason="dead-lettered", code=DEAD_LETTERED, failed_type="ReserveLine")
    scenario.answer(reserve(scenario, "a"), gave_up)  # it may have reserved
    scenario.run_until_idle()
    assert scenario.status == "compensating"
    scenario.expect_command("stock", ReleaseLine(sku="a")).reply(Reserved())
    scenario.expect_command("orders", CancelOrder()).reply(Reserved())
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert released(scenario) == ["a"]


def test_a_resume_sends_every_member_and_item_still_out_again_under_their_ids() -> None:
    scenario = reserving("a", "b", "c")
    scenario.answer(reserve(scenario, "a"), Reserved(reference="ra"))  # c leaves now
    scenario.run_until_idle()
    out = {m.envelope.message_id for m in [reserve(scenario, "b"), reserve(scenario, "c")]}
    before = len(scenario.sent_to("stock"))
    assert scenario.resume()
    again = {m.envelope.message_id for m in scenario.sent_to("stock")[before:]}
    assert again == out
    [first, second] = scenario.sent_to("customers")
    assert first.envelope.message_id == second.envelope.message_id


def test_a_fan_out_member_shows_in_the_group_shape_and_may_not_be_the_pivot() -> None:
    saga = order_saga()
    [group] = [s for s in shape(saga) if s["step"] == "reserve"]
    assert [m["kind"] for m in group["members"]] == ["for_each", "remote"]
    reserve_step = saga.steps[1]
    assert isinstance(reserve_step, ParallelGroup)
    fan = reserve_step.members[0]
    assert isinstance(fan, ForEach)
    saga.steps[1] = replace(reserve_step, members=(replace(fan, pivot=True),))
    with pytest.raises(ConfigurationError, match="member 'reserve_lines' is marked pivot"):
        saga.validate()


def test_items_that_are_not_a_list_fail_the_group_and_the_sibling_sent_is_undone_late() -> None:
    saga = Saga("order", data=Order)
    saga.remote("create", service="orders", command=CreateOrder, compensate=CancelOrder)
    with saga.parallel("reserve"):
        saga.remote("reserve_credit", service="customers", command=ReserveCredit,
                    compensate=ReleaseCredit)  # fmt: skip
        saga.for_each("reserve_lines", items=lambda d: len(d.lines), service="stock",
                      command=lambda d, line: ReserveLine(sku="x"))  # fmt: skip
    scenario = SagaScenario(saga, lines("a"))
    scenario.expect_command("orders", CreateOrder()).reply(Reserved())
    scenario.expect_command("orders", CancelOrder()).reply(Reserved())
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert scenario.record.last_error == "fan-out 'reserve_lines': items= must give a list, got int"
    scenario.answer(credit(scenario), Reserved())  # it left with the group: undone when it lands
    scenario.run_until_idle()
    assert credit_releases(scenario) == 1
