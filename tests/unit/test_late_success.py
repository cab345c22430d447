"""A success that comes after the saga compensated past its step: its compensation is awaited.

A parallel group's member still out when its sibling failed answers late. Its compensation
is retried under the step's retry policy, given up on for an operator (the saga
``compensation_failed``, its ``last_error`` naming the step), sent again by a resume, and
its success is logged; a compensated saga is compensated again once it succeeds. A saga
still compensating, or stopped at a failed compensation, undoes it after that step.
"""

from __future__ import annotations

from datetime import timedelta

from saga import Saga, StepRetry
from saga.testing import PendingCommand, SagaScenario
from tests.support.group_order import Order, Release, Reserve, Reserved, order_saga


def order_saga_retried() -> Saga[Order]:
    """The group's order saga whose compensations are tried 3 times, 1 s then 2 s apart."""
    saga = order_saga(retry=StepRetry(attempts=3, initial_delay=1.0))
    saga.validate()
    return saga


RELEASE_CREDIT = Release(what="credit", reference="c-1")


def stock_failing() -> tuple[SagaScenario, PendingCommand]:
    """A saga whose order was created and whose stock reservation failed, with its credit
    reservation, still unanswered."""
    s = SagaScenario(order_saga_retried(), Order())
    s.expect_command("orders").reply()
    s.expect_command("inventory", Reserve(what="stock")).fail("out of stock")
    return s, s.expect_command("customers", Reserve(what="credit"))


def credit_answering_late() -> SagaScenario:
    """A saga compensated while its credit reservation was out, which then succeeds."""
    s, credit = stock_failing()
    s.expect_command("orders", Release(what="order")).reply()
    s.run_until_idle()
    assert s.status == "compensated"
    credit.reply(Reserved(reference="c-1"))
    s.run_until_idle()
    return s


def test_a_late_success_whose_compensation_fails_is_retried_until_it_succeeds() -> None:
    s = credit_answering_late()
    assert (s.status, s.step) == ("compensating", "reserve_credit")
    s.expect_command("customers", RELEASE_CREDIT).fail("ledger down")
    s.run_until_idle()
    assert s.status == "compensating"  # its retry timer is due in 1 s

    s.advance(timedelta(seconds=1))
    s.expect_command("customers", RELEASE_CREDIT).reply()
    s.run_until_idle()
    assert (s.status, s.step) == ("compensated", None)
    assert s.steps[-4:] == [
        "create compensation succeeded",
        "reserve_credit late_success",
        "reserve_credit compensation failed",
        "reserve_credit compensation succeeded",
    ]
    assert s.record.last_error == "reserve_stock: out of stock"  # why it compensated, still


def test_a_late_compensation_given_up_on_stops_the_saga_until_a_resume() -> None:
    s = credit_answering_late()
    for delay in (0, 1, 2):  # three attempts, each failing
        s.advance(timedelta(seconds=delay))
        s.expect_command("customers", RELEASE_CREDIT).fail("ledger down")
        s.run_until_idle()
    assert (s.status, s.step) == ("compensation_failed", "reserve_credit")
    assert s.record.last_error == "reserve_credit: ledger down"
    assert s.scheduled == []

    assert s.resume()
    s.expect_command("customers", RELEASE_CREDIT).reply()
    s.run_until_idle()
    assert s.status == "compensated"
    assert s.steps[-2:] == [
        "reserve_credit compensation failed",
        "reserve_credit compensation succeeded",
    ]


def test_a_late_success_while_compensating_is_undone_after_the_step_being_undone() -> None:
    s, credit = stock_failing()
    release_order = s.expect_command("orders", Release(what="order"))
    credit.reply(Reserved(reference="c-1"))  # while the order's release is out
    s.run_until_idle()
    assert [m.type for m in s.sent_to("customers")] == ["Reserve"]  # no release yet

    release_order.reply()
    s.expect_command("customers", RELEASE_CREDIT).reply()
    s.run_until_idle()
    assert s.status == "compensated"
    assert s.steps[-3:] == [
        "reserve_credit late_success",
        "create compensation succeeded",
        "reserve_credit compensation succeeded",
    ]


def test_a_second_copy_of_the_late_success_sends_nothing_more() -> None:
    s = credit_answering_late()
    [late] = [m for m in s.sent_to("customers") if m.type == "Reserve"]
    s.answer(late, Reserved(reference="c-1"))  # the participant answers again
    s.run_until_idle()
    s.expect_command("customers", RELEASE_CREDIT).reply()
    s.run_until_idle()
    assert s.status == "compensated"
    assert s.sent("customers", Release) == [RELEASE_CREDIT]


def test_a_late_success_while_stopped_at_a_failed_compensation_is_undone_on_resume() -> None:
    s, credit = stock_failing()
    for delay in (0, 1, 2):
        s.advance(timedelta(seconds=delay))
        s.expect_command("orders", Release(what="order")).fail("orders down")
        s.run_until_idle()
    assert (s.status, s.step) == ("compensation_failed", "create")
    credit.reply(Reserved(reference="c-1"))
    s.run_until_idle()
    assert (s.status, s.step) == ("compensation_failed", "create")
    assert [m.type for m in s.sent_to("customers")] == ["Reserve"]  # no release yet

    assert s.resume()
    s.expect_command("orders", Release(what="order")).reply()
    s.expect_command("customers", RELEASE_CREDIT).reply()
    s.run_until_idle()
    assert s.status == "compensated"
    assert s.steps[-2:] == [
        "create compensation succeeded",
        "reserve_credit compensation succeeded",
    ]
