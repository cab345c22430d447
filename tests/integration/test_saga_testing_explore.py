"""saga.testing's explore on stubbed participants: a failing schedule is found, shrunk, and
printed as a harness test that fails the same way when pasted."""

from __future__ import annotations

from uuid import UUID

import pytest

from saga import StepFailed
from saga.messaging.control import Ack
from saga.testing import Fail, SagaHarness
from tests.integration.test_saga_testing import (
    Charge,
    HoldData,
    Reserve,
    Reserved,
    hold_registry,
)

registry, hold = hold_registry()


def reserve_never_refused(h: SagaHarness, saga_id: UUID) -> bool:
    """Broken by a refusal (or a dead letter) of the vault's Reserve, by nothing else."""
    return "reserve failed" not in h.steps(saga_id)


def stubbed(saga_harness) -> SagaHarness:
    h: SagaHarness = saga_harness(registry)
    h.on("vault", Reserve, Reserved(reservation_id="r-1"))
    h.on("bank", Charge, Ack())
    return h


def test_explore_shrinks_a_stubs_failure_and_prints_a_test_that_replays_it(saga_harness) -> None:
    with pytest.raises(AssertionError, match="reserve_never_refused returned False") as raised:
        stubbed(saga_harness).explore(hold, HoldData(order_id="o-1"), reserve_never_refused)

    [report] = [n for n in raised.value.__notes__ if n.startswith("explore:")]
    assert "#   vault Reserve #1: fails" in report  # shrunk from a dead letter, if drawn
    test_source = report[report.index("def test_explored_schedule") :]
    assert "h.on('vault', Reserve, Fail(\"explored failure\"))" in test_source
    namespace = {**globals(), "StepFailed": StepFailed, "Fail": Fail}
    exec(test_source, namespace)
    with pytest.raises(AssertionError):
        namespace["test_explored_schedule"](stubbed(saga_harness))


def test_explore_passes_when_every_schedule_keeps_the_invariant(saga_harness) -> None:
    def never_half_done(h: SagaHarness, saga_id: UUID) -> None:
        assert h.status(saga_id) in ("completed", "compensated", "compensating"), h.steps(saga_id)

    stubbed(saga_harness).explore(hold, HoldData(order_id="o-1"), never_half_done, max_examples=30)
