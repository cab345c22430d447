"""A saga definition's recorded shape: stable for the same steps, and its changes in words."""

from __future__ import annotations

from saga import Saga, Tx
from saga.engine.fingerprints import describe_change, fingerprint, shape
from tests.support import loans


def _noop(tx: Tx, data: loans.LoanData) -> None:
    return None


def test_the_same_definition_built_twice_has_one_fingerprint() -> None:
    first, again = shape(loans.build_loan(1)), shape(loans.build_loan(1))
    assert first == again and fingerprint(first) == fingerprint(again)
    assert [step["step"] for step in first] == [
        "request_loan", "credit_check", "wait_approval", "wait_signature", "disburse"
    ]  # fmt: skip
    assert fingerprint(shape(loans.build_loan(2))) != fingerprint(first)


def test_changes_are_named_step_by_step() -> None:
    v1 = shape(loans.build_loan(1))
    renamed = shape(loans.build_loan(1, approval_step="await_approval"))
    assert describe_change(v1, renamed) == (
        "step(s) 'wait_approval' removed or renamed; step(s) 'await_approval' added"
    )
    assert describe_change(v1, shape(loans.build_loan(2))) == "step(s) 'compliance_check' added"
    one, two = Saga("s", data=loans.LoanData), Saga("s", data=loans.LoanData)
    one.local("a", compensate=_noop)(_noop)
    one.local("b")(_noop)
    two.local("b", pivot=True)(_noop)
    two.local("a")(_noop)
    assert describe_change(shape(one), shape(two)) == (
        "steps reordered (a > b became b > a); step 'b': pivot False became True; "
        "step 'a': compensated True became False"
    )
