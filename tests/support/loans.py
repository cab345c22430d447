"""Loan approval sagas for the long-running tests: waits, versions, migration.

``registry_v1`` knows only version 1; ``registry_v2`` knows both, and version 2
inserts ``compliance_check`` after ``wait_approval`` for sagas that have not
passed it. ``registry_v1_edited`` has version 1 with its approval step renamed
and no version bump (a deploy that would strand running sagas). ``quick`` waits
one second for an approval (timeout races).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from saga import HandlerContext, Saga, SagaRegistry, Service, StepFailed
from tests.support.sagas import FAST, Tx, effect

LONG = timedelta(days=5)
QUICK = timedelta(seconds=1)
RACE = timedelta(seconds=3)


class LoanData(BaseModel):
    loan_id: str
    amount: int = 1000
    score: int | None = None
    approver: str | None = None
    note: str = ""


class CheckCredit(BaseModel):
    loan_id: str


class CreditScore(BaseModel):
    score: int


class Approval(BaseModel):
    approver: str
    approved: bool = True


class Signature(BaseModel):
    signer: str


def _approve(d: LoanData, e: Approval) -> LoanData:
    if not e.approved:
        raise StepFailed(f"rejected by {e.approver}")
    return d.model_copy(update={"approver": e.approver})


def build_loan(version: int, approval_step: str = "wait_approval") -> Saga[LoanData]:
    loan = Saga("loan", data=LoanData, version=version)

    @loan.local("request_loan", compensate="cancel_request")
    def request_loan(tx: Tx, d: LoanData) -> None:
        effect(tx, "request", d.loan_id)

    @loan.local_compensation("cancel_request")
    def cancel_request(tx: Tx, d: LoanData) -> None:
        effect(tx, "cancel", d.loan_id)

    loan.remote(
        "credit_check",
        service="bureau",
        command=CheckCredit,
        reply=CreditScore,
        on_reply=lambda d, r: d.model_copy(update={"score": r.score}),
    )
    loan.wait(approval_step, event="approval", payload=Approval, timeout=LONG, on_event=_approve)
    if version >= 2:

        @loan.local("compliance_check")
        def compliance_check(tx: Tx, d: LoanData) -> None:
            effect(tx, "compliance", d.loan_id)

    loan.wait("wait_signature", event="signature", payload=Signature)

    @loan.local("disburse")
    def disburse(tx: Tx, d: LoanData) -> None:
        effect(tx, "disburse", d.loan_id)

    if version >= 2:
        loan.migrate_from(1, unless_passed="wait_approval")
    return loan


def build_quick(name: str = "quick_loan", timeout: timedelta = QUICK) -> Saga[LoanData]:
    quick = Saga(name, data=LoanData)

    @quick.local("open", compensate="close")
    def open_(tx: Tx, d: LoanData) -> None:
        effect(tx, "open", d.loan_id)

    @quick.local_compensation("close")
    def close(tx: Tx, d: LoanData) -> None:
        effect(tx, "close", d.loan_id)

    quick.wait("approval", event="approval", payload=Approval, timeout=timeout, on_event=_approve)

    @quick.local("pay")
    def pay(tx: Tx, d: LoanData) -> None:
        effect(tx, "pay", d.loan_id)

    return quick


def _registry(*sagas: Saga[Any]) -> SagaRegistry:
    registry = SagaRegistry("lending", retry=FAST)
    for saga in sagas:
        registry.register(saga)
    return registry


registry_v1 = _registry(build_loan(1), build_quick(), build_quick("race_loan", RACE))
registry_v2 = _registry(build_loan(1), build_loan(2), build_quick())
registry_v2_only = _registry(build_loan(2), build_quick())
registry_v1_edited = _registry(build_loan(1, approval_step="await_approval"), build_quick())

bureau = Service("bureau", retry=FAST)


@bureau.handler(CheckCredit)
def check_credit(tx: Tx, cmd: CheckCredit, ctx: HandlerContext) -> CreditScore:
    return CreditScore(score=700)
