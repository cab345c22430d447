"""SagaScenario on a saga that waits: signals, a wait's timeout on the virtual clock."""

from __future__ import annotations

from datetime import timedelta

from saga.testing import SagaScenario
from saga.testing.clock import EPOCH
from tests.support.loans import Approval, CheckCredit, CreditScore, LoanData, Signature, build_loan

#: The loan's local steps only record effects: here they do nothing.
NO_EFFECTS = {"request_loan": None, "cancel_request": None, "disburse": None}


def waiting_loan() -> SagaScenario:
    s = SagaScenario(build_loan(1), LoanData(loan_id="l1"), local_steps=NO_EFFECTS)
    s.expect_command("bureau", CheckCredit(loan_id="l1")).reply(CreditScore(score=700))
    s.run_until_idle()
    assert (s.status, s.step) == ("running", "wait_approval")
    return s


def test_a_wait_times_out_on_the_virtual_clock_and_compensates() -> None:
    s = waiting_loan()
    [(due, _)] = s.scheduled
    assert due == EPOCH + timedelta(days=5)
    s.advance(timedelta(days=4, hours=23))
    assert s.step == "wait_approval"

    s.advance(timedelta(hours=1))
    assert s.status == "compensated"
    assert s.local_calls == ["request_loan", "cancel_request"]


def test_signals_move_the_saga_on_and_its_timeout_then_changes_nothing() -> None:
    s = waiting_loan()
    assert s.signal("signature", Signature(signer="x")) is not None  # not what it waits for
    assert s.signal("approval", Approval(approver="ann")) is None
    assert s.step == "wait_signature"

    s.advance(timedelta(days=6))  # the approval's timeout comes and goes
    assert s.step == "wait_signature"
    assert s.signal("signature", {"signer": "bob"}) is None
    assert s.status == "completed"
    assert s.data == LoanData(loan_id="l1", score=700, approver="ann")
    assert s.local_calls == ["request_loan", "disburse"]


def test_the_scenario_finds_and_checks_its_commands_as_the_harness_does() -> None:
    s = waiting_loan()
    [check] = s.sent("bureau", CheckCredit, where=lambda c: c.loan_id == "l1")
    assert check == CheckCredit(loan_id="l1")
    s.assert_sent("bureau", CheckCredit(loan_id="l1"), any_order=True)
