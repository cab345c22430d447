"""The loan approval case: 10,000 waiting sagas, a new version, migration, then approvals.

Orchestrator, participant and relay are real ``saga`` subprocesses on RabbitMQ.
"""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

from saga.examples.order_saga.processes import SagaProcess, saga_env
from tests.support import loans
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.services import EFFECTS_DDL, effects_per_key
from tests.support.wait import wait_until

SAGAS = 10_000
PASSED_BEFORE = 1_000
BATCH = 500


def rss_mb(process: SagaProcess) -> float:
    for line in Path(f"/proc/{process.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def start_loans(
    db: TestDatabase, prefix: str, count: int, registry=loans.registry_v1
) -> list[UUID]:  # type: ignore[no-untyped-def]
    ids: list[UUID] = []
    with db.connect(autocommit=False) as conn:
        for first in range(0, count, BATCH):
            with conn.transaction():
                ids += [
                    registry.start(conn, "loan", loans.LoanData(loan_id=f"{prefix}{i}"))
                    for i in range(first, min(first + BATCH, count))
                ]
    return ids


def signal_all(db: TestDatabase, ids: list[UUID], event: str, data: dict[str, str]) -> None:
    with db.connect(autocommit=False) as conn:
        for first in range(0, len(ids), BATCH):
            with conn.transaction():
                for saga_id in ids[first : first + BATCH]:
                    loans.registry_v2.signal(conn, saga_id, event, data)


def waiting(db: TestDatabase, event: str) -> int:
    return int(
        db.scalar("SELECT count(*) FROM saga.saga_instances WHERE waiting_for = %s", (event,))
    )


def test_ten_thousand_waiting_loans_migrate_to_version_two(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    db.execute(EFFECTS_DDL)
    rabbit.use("lending", "bureau")
    env = saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix)
    relay = SagaProcess(["relay"], env, tmp_path, "relay")
    bureau = SagaProcess(["consume", "tests.support.loans:bureau"], env, tmp_path, "bureau")
    v1 = SagaProcess(["consume", "tests.support.loans:registry_v1"], env, tmp_path, "v1")
    processes = [relay, bureau, v1]
    try:
        # -- park 10,000 version-1 sagas at wait_approval, watching the orchestrator's memory
        warm = start_loans(db, "w", 200)
        wait_until(lambda: waiting(db, "approval") == 200, timeout=120, what="warm-up parked")
        rss_warm = rss_mb(v1)
        rest = start_loans(db, "l", SAGAS - 200)
        wait_until(lambda: waiting(db, "approval") >= SAGAS // 2, timeout=300, interval=0.2,
                   what="5,000 parked")  # fmt: skip
        rss_half = rss_mb(v1)
        wait_until(lambda: waiting(db, "approval") == SAGAS, timeout=300, what="10,000 parked")
        rss_full = rss_mb(v1)
        print(f"\norchestrator RSS: {rss_warm:.1f} MB with 200 waiting, {rss_half:.1f} MB with "
              f"5,000, {rss_full:.1f} MB with 10,000")  # fmt: skip
        assert rss_full - rss_half < 5.0  # nothing held per waiting saga

        # -- other sagas keep flowing while 10,000 wait
        with db.connect(autocommit=False) as conn, conn.transaction():
            quick = [
                loans.registry_v1.start(conn, "quick_loan", loans.LoanData(loan_id=f"q{i}"))
                for i in range(100)
            ]
            for saga_id in quick:
                loans.registry_v1.signal(conn, saga_id, "approval", {"approver": "fast"})
        wait_until(
            lambda: (
                db.scalar(
                    "SELECT count(*) FROM saga.saga_instances WHERE name = 'quick_loan' "
                    "AND status = 'completed'"
                )
                == 100
            ),
            timeout=60,
            what="100 other sagas completed",
        )

        # -- 1,000 pass wait_approval on version 1, before the new version ships
        early = (warm + rest)[:PASSED_BEFORE]
        signal_all(db, early, "approval", {"approver": "early"})
        wait_until(lambda: waiting(db, "signature") == PASSED_BEFORE, timeout=120, what="passed")

        # -- deploy version 2 and migrate
        assert v1.terminate() == 0, v1.output()[-2000:]
        processes.remove(v1)
        v2 = SagaProcess(["consume", "tests.support.loans:registry_v2"], env, tmp_path, "v2")
        processes.append(v2)
        migrate = ["migrate-instances", "loan", "--to", "2",
                   "--registry", "tests.support.loans:registry_v2"]  # fmt: skip
        dry = SagaProcess([*migrate, "--dry-run"], env, tmp_path, "dry")
        assert dry.wait(120) == 0, dry.output()
        assert "9,000 would move, 1,000 stay" in dry.output(), dry.output()
        real = SagaProcess(migrate, env, tmp_path, "migrate")
        assert real.wait(300) == 0, real.output()
        assert "moved 9,000" in real.output(), real.output()

        # -- approve the rest, sign everything; new sagas run version 2
        later = (warm + rest)[PASSED_BEFORE:]
        signal_all(db, later, "approval", {"approver": "late"})
        fresh = start_loans(db, "n", 50, registry=loans.registry_v2)
        wait_until(lambda: waiting(db, "approval") == 50, timeout=120, what="new sagas parked")
        signal_all(db, fresh, "approval", {"approver": "new"})
        wait_until(lambda: waiting(db, "signature") == SAGAS + 50, timeout=300, what="all approved")
        signal_all(db, warm + rest + fresh, "signature", {"signer": "customer"})
        wait_until(
            lambda: db.scalar("SELECT count(*) FROM saga.saga_instances "
                              "WHERE name = 'loan' AND status = 'completed'") == SAGAS + 50,
            timeout=300,
            what="every loan disbursed",
        )  # fmt: skip
    finally:
        for process in processes:
            assert process.terminate(60) == 0, process.output()[-2000:]

    compliance = effects_per_key(db, "compliance")
    early_keys = {f"w{i}" for i in range(200)} | {f"l{i}" for i in range(PASSED_BEFORE - 200)}
    assert set(compliance) & early_keys == set()  # past wait_approval before the migration
    assert len(compliance) == SAGAS - PASSED_BEFORE + 50
    assert set(compliance.values()) == {1}  # exactly once
    assert {f"n{i}" for i in range(50)} <= set(compliance)  # new sagas run version 2
    misordered = db.scalar(
        """
        SELECT count(*) FROM effects c JOIN effects d ON d.key = c.key AND d.kind = 'disburse'
        WHERE c.kind = 'compliance' AND c.id > d.id
        """
    )
    assert misordered == 0  # compliance_check always before disburse
    disbursed = effects_per_key(db, "disburse")
    assert len(disbursed) == SAGAS + 50
    assert {key for key, n in disbursed.items() if n != 1} == set()  # each loan paid out once
