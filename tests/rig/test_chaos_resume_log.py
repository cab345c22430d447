"""The cluster chaos run lists the sagas its orders consumers resumed by themselves,
read from their logs (every process of the service, every run of each)."""

from __future__ import annotations

from pathlib import Path

from tests.rig.stuck_sagas import automatic_resumes

ONE = "01a2376e-70a6-7244-a3da-1bae1e3868db"
TWO = "01a2376e-770e-7223-aa28-cc59e7c7a19a"
THREE = "01a2376f-c99e-7391-be88-b84385aa30b8"


def test_every_resumed_saga_of_every_orders_consumer_log_is_listed(tmp_path: Path) -> None:
    prefix = "2026-12-02 15:46:00,190 WARNING saga.consumers.stuck_sweep: "
    (tmp_path / "orders.log").write_text(
        f"{prefix}resumed 1 stuck saga(s) of orders (no progress for 0:00:45): "
        f"{ONE} at reserve_stock [consumer=orders]\n"
        "2026-12-02 15:46:01,000 INFO    saga.consumers.worker: worker-1 consuming\n"
    )
    (tmp_path / "orders-2.log").write_text(
        f"{prefix}resumed 2 stuck saga(s) of orders (no progress for 0:00:45): "
        f"{TWO} at reserve_stock, {THREE} at charge_payment\n"
    )
    (tmp_path / "payments.log").write_text(f"{prefix}resumed 1 stuck saga(s) of payments: x\n")
    assert automatic_resumes(tmp_path) == [
        f"{TWO} at reserve_stock",
        f"{THREE} at charge_payment",
        f"{ONE} at reserve_stock",
    ]
    assert automatic_resumes(tmp_path / "missing") == []
