"""The capacity model of docs/scaling.md: a saga's CPU priced by the consumer transactions
that carry it, calibrated from two 1-process runs (bench.scaling)."""

from __future__ import annotations

import pytest

from bench.scaling import CostLine, CostModel, Run
from saga.examples.order_saga.cluster import SAGA_SERVICES


def run(processes: int, transactions: float, machine_ms: float, service_ms: float) -> Run:
    return Run(
        processes=processes,
        sagas_per_s=0.0,
        machine_ms=machine_ms,
        cores=2.0,
        busy_share=1.0,
        component_ms={s: service_ms for s in SAGA_SERVICES},
        steps={s: 1.0 for s in SAGA_SERVICES},
        transactions=transactions,
    )


def test_a_line_through_large_and_small_batches() -> None:
    line = CostLine.through((0.1, 10.0), (0.9, 22.0))
    assert line.per_transaction_ms == pytest.approx(15.0)
    assert line.fixed_ms == pytest.approx(8.5)
    assert line.at(0.5) == pytest.approx(16.0)


def test_calibration_runs_with_the_same_batches_are_refused() -> None:
    with pytest.raises(ValueError, match="too close to tell"):
        CostLine.through((0.10, 10.0), (0.15, 11.0))


def test_more_transactions_per_saga_predict_fewer_sagas() -> None:
    model = CostModel.fit(run(1, 0.1, 10.0, 1.0), run(1, 0.9, 22.0, 2.0))
    large, _ = model.predict(run(4, 0.1, 0.0, 0.0))
    small, limit = model.predict(run(4, 0.65, 0.0, 0.0))
    assert large == pytest.approx(2 * 1000 / 10.0)
    assert small == pytest.approx(2 * 1000 / (8.5 + 15.0 * 0.65))
    assert limit == "the machine's CPU"


def test_a_service_on_one_process_can_be_the_bound() -> None:
    model = CostModel.fit(run(1, 0.1, 1.0, 4.0), run(1, 0.9, 2.0, 8.0))
    predicted, limit = model.predict(run(1, 0.1, 0.0, 0.0))
    assert predicted == pytest.approx(1000 / 4.0)
    assert limit.endswith("consumers' Python (one core each)")


def test_the_model_is_calibrated_at_one_process() -> None:
    with pytest.raises(ValueError, match="1-process runs"):
        CostModel.fit(run(2, 0.1, 10.0, 1.0), run(1, 0.9, 22.0, 2.0))
