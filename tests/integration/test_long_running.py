"""Durable waits, signals, timeouts, deadlines, versions and data caps on real servers."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from saga import HandlerContext, Outbox, Saga, SagaRegistry, Service, StepRetry
from saga.effects.claimcheck import ClaimCheck
from saga.errors import ClaimNotFound, ConfigurationError, SagaDataTooLarge, SignalRejected
from saga.messaging.control import Signal
from saga.operations.retention import Pruner
from tests.support import loans
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.running import ThreadDied, running_relay, running_service
from tests.support.services import EFFECTS_DDL
from tests.support.wait import wait_until


@pytest.fixture(autouse=True)
def _effects_table(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)


@pytest.fixture
def lending(db: TestDatabase, rabbit: TestBroker) -> Iterator[None]:
    with ExitStack() as stack:
        stack.enter_context(running_relay(db, rabbit))
        stack.enter_context(running_service(loans.registry_v1.as_service(), db, rabbit))
        stack.enter_context(running_service(loans.bureau, db, rabbit))
        yield


def start(
    db: TestDatabase, name: str, loan_id: str, registry: SagaRegistry = loans.registry_v1
) -> UUID:
    with db.connect(autocommit=False) as conn, conn.transaction():
        return registry.start(conn, name, loans.LoanData(loan_id=loan_id))


def signal(db: TestDatabase, saga_id: UUID, event: str, data: BaseModel | dict[str, Any]) -> None:
    with db.connect(autocommit=False) as conn, conn.transaction():
        loans.registry_v1.signal(conn, saga_id, event, data)


def row(db: TestDatabase, saga_id: UUID) -> tuple[Any, ...]:
    return db.rows(
        "SELECT status, step, waiting_for FROM saga.saga_instances WHERE id = %s", (saga_id,)
    )[0]


#: ``saga signal`` checks the data with the registry's definitions.
REGISTRY = ("--registry", "tests.support.loans:registry_v1")


def waiting_for(db: TestDatabase, saga_id: UUID, event: str) -> bool:
    return row(db, saga_id)[2] == event


def effects(db: TestDatabase, key: str) -> list[str]:
    return [r[0] for r in db.rows("SELECT kind FROM effects WHERE key = %s ORDER BY id", (key,))]


def test_signals_move_a_waiting_saga_to_completion(db: TestDatabase, lending: None) -> None:
    saga_id = start(db, "loan", "l1")
    wait_until(lambda: waiting_for(db, saga_id, "approval"), what="waiting for approval")
    schema = db.scalar(
        "SELECT step_state -> 'wait_schema' FROM saga.saga_instances WHERE id = %s", (saga_id,)
    )
    assert schema["required"] == ["approver"]
    signal(db, saga_id, "approval", loans.Approval(approver="ann"))
    wait_until(lambda: waiting_for(db, saga_id, "signature"), what="waiting for signature")
    result = saga_cli(
        db.url, "signal", str(saga_id), "signature", "--data", '{"signer": "bob"}', *REGISTRY
    )
    assert result.returncode == 0, result.stderr
    wait_until(lambda: row(db, saga_id)[0] == "completed", what="completed")
    assert effects(db, "l1") == ["request", "disburse"]
    data = db.scalar("SELECT data FROM saga.saga_instances WHERE id = %s", (saga_id,))
    assert (data["approver"], data["score"]) == ("ann", 700)


def test_an_event_handler_can_fail_the_saga(db: TestDatabase, lending: None) -> None:
    saga_id = start(db, "loan", "l2")
    wait_until(lambda: waiting_for(db, saga_id, "approval"), what="waiting")
    signal(db, saga_id, "approval", {"approver": "ann", "approved": False})
    wait_until(lambda: row(db, saga_id)[0] == "compensated", what="compensated")
    assert effects(db, "l2") == ["request", "cancel"]


def test_timeout_compensates(db: TestDatabase, lending: None) -> None:
    saga_id = start(db, "quick_loan", "q1")
    wait_until(lambda: row(db, saga_id)[0] == "compensated", timeout=20, what="timed out")
    assert effects(db, "q1") == ["open", "close"]
    outcomes = db.rows(
        "SELECT step, outcome, error FROM saga.saga_steps WHERE saga_id = %s ORDER BY id",
        (saga_id,),
    )
    assert outcomes[1][:2] == ("approval", "timed_out") and "no 'approval'" in outcomes[1][2]


def test_signal_racing_the_timeout_is_resolved_exactly_once(
    db: TestDatabase, lending: None
) -> None:
    rng = random.Random(5)
    outbox = Outbox()
    ids = []
    with db.connect(autocommit=True) as conn:
        for i in range(200):
            # A saga and its approval in one short transaction: both are timed from its
            # now(), and the approval lands somewhere around the three-second timeout.
            # (Timed from one transaction for all 200, a setup slower than the timeout on a
            # loaded machine made every timeout due at commit, ahead of every signal, which
            # the relay sends in id order: the timeout won every race.)
            with conn.transaction():
                saga_id = loans.registry_v1.start(
                    conn, "race_loan", loans.LoanData(loan_id=f"race-{i}")
                )
                outbox.add(
                    conn,
                    Signal(saga_id=saga_id, event="approval", data={"approver": "racer"}),
                    destination="lending",
                    saga_id=saga_id,
                    deliver_after=timedelta(seconds=rng.uniform(1.5, 4.5)),
                )
            ids.append(saga_id)
    wait_until(
        lambda: (
            db.scalar(
                "SELECT count(*) FROM saga.saga_instances "
                "WHERE status IN ('completed', 'compensated')"
            )
            == 200
        ),
        timeout=60,
        what="200 settled",
    )
    wait_until(
        lambda: db.scalar("SELECT count(*) FROM saga.saga_steps WHERE outcome = 'ignored'") == 200,
        timeout=30,
        what="every loser recorded",
    )
    statuses = dict(db.rows("SELECT id, status FROM saga.saga_instances"))
    for i, saga_id in enumerate(ids):
        done = effects(db, f"race-{i}")
        if statuses[saga_id] == "completed":
            assert done == ["open", "pay"]
        else:
            assert done == ["open", "close"]
    per_saga = db.rows(
        "SELECT saga_id, count(*) FILTER (WHERE outcome IN ('succeeded', 'timed_out')), "
        "count(*) FILTER (WHERE outcome = 'ignored') FROM saga.saga_steps "
        "WHERE step = 'approval' OR error LIKE 'timeout lost%%' OR step = 'signal approval' "
        "GROUP BY saga_id"
    )
    assert all((won, lost) == (1, 1) for _, won, lost in per_saga), per_saga
    won_by_signal = sum(1 for s in statuses.values() if s == "completed")
    assert 0 < won_by_signal < 200, won_by_signal  # both sides won some races
    print(f"\nsignal won {won_by_signal} races, timeout won {200 - won_by_signal}")


def test_bad_signals_are_refused_and_change_nothing(db: TestDatabase, lending: None) -> None:
    waiting = start(db, "loan", "l3")
    wait_until(lambda: waiting_for(db, waiting, "approval"), what="waiting")
    finished = start(db, "quick_loan", "q3")
    wait_until(lambda: row(db, finished)[0] == "compensated", timeout=20, what="finished")
    before = db.scalar("SELECT count(*) FROM saga.outbox")
    cases = [
        (["signal", "0190a5c0-0000-7000-8000-000000000000", "approval"], "no saga"),
        (["signal", str(finished), "approval", "--data", '{"approver": "x"}'], "is compensated"),
        (
            ["signal", str(waiting), "signature", "--data", '{"signer": "x"}'],
            "waiting for 'approval'",
        ),
        (
            ["signal", str(waiting), "approval", "--data", '{"approver": 5}'],
            "invalid 'approval' data",
        ),
        (["signal", str(waiting), "approval", "--data", "{}"], "Field required"),
        (["signal", str(waiting), "approval", "--data", "not json"], "not JSON"),
    ]
    for args, message in cases:
        result = saga_cli(db.url, *args, *REGISTRY)
        assert result.returncode == 1, (args, result.stdout)
        assert message in result.stderr, (args, result.stderr)
    with pytest.raises(SignalRejected, match="invalid 'approval' data"):
        signal(db, waiting, "approval", {"approver": ["not", "a", "string"]})
    assert db.scalar("SELECT count(*) FROM saga.outbox") == before
    assert row(db, waiting) == ("running", "wait_approval", "approval")


def test_oversized_saga_data_is_refused_at_the_write(db: TestDatabase) -> None:
    big = Saga("big", data=loans.LoanData, max_data_bytes=1024)

    @big.local("only")
    def only(tx: Any, d: loans.LoanData) -> None:
        tx.execute("INSERT INTO effects (kind, key) VALUES ('only', %s)", (d.loan_id,))

    SagaRegistry("bigs").register(big)
    too_large = pytest.raises(SagaDataTooLarge, match="over the 1024-byte cap")
    with db.connect(autocommit=False) as conn, too_large, conn.transaction():
        conn.execute("INSERT INTO effects (kind, key) VALUES ('caller', 'x')")
        big.start(conn, loans.LoanData(loan_id="b1", note="x" * 2000))
    assert db.scalar("SELECT count(*) FROM effects") == 0
    assert db.scalar("SELECT count(*) FROM saga.saga_instances") == 0


def test_a_service_refuses_to_run_without_versions_that_unfinished_sagas_need(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    start(db, "loan", "old")  # a version 1 saga, unfinished
    refused = pytest.raises(ThreadDied, match="version 1 has 1 unfinished saga")
    with refused, running_service(loans.registry_v2_only.as_service(), db, rabbit):
        pass
    result = saga_cli(
        db.url, "consume", "tests.support.loans:registry_v2_only", SAGA_BROKER_URL=rabbit.url
    )
    assert result.returncode == 2, result.stderr
    assert "version 1 has 1 unfinished saga(s) but is not registered" in result.stderr
    with db.connect(autocommit=False) as conn, pytest.raises(ConfigurationError):
        loans.registry_v2_only.check_versions(conn)
    with db.connect(autocommit=False) as conn:
        loans.registry_v2.check_versions(conn)  # both versions: fine


def test_migrating_running_sagas_and_versions_report(db: TestDatabase, lending: None) -> None:
    early = [start(db, "loan", f"m{i}") for i in range(6)]
    for saga_id in early:
        wait_until(lambda s=saga_id: waiting_for(db, s, "approval"), what="waiting")
    for saga_id in early[:2]:  # these pass wait_approval before the migration
        signal(db, saga_id, "approval", loans.Approval(approver="ann"))
        wait_until(lambda s=saga_id: waiting_for(db, s, "signature"), what="passed approval")
    dry = saga_cli(db.url, "migrate-instances", "loan", "--to", "2", "--dry-run",
              "--registry", "tests.support.loans:registry_v2")  # fmt: skip
    assert "4 would move, 2 stay" in dry.stdout, dry.stderr
    assert db.scalar("SELECT count(*) FROM saga.saga_instances WHERE saga_version = 2") == 0
    real = saga_cli(db.url, "migrate-instances", "loan", "--to", "2", "--batch-size", "3",
               "--registry", "tests.support.loans:registry_v2")  # fmt: skip
    assert "moved 4" in real.stdout, real.stderr
    versions = dict(db.rows("SELECT id, saga_version FROM saga.saga_instances"))
    assert [versions[s] for s in early] == [1, 1, 2, 2, 2, 2]
    migrated_log = db.scalar("SELECT count(*) FROM saga.saga_steps WHERE outcome = 'migrated'")
    assert migrated_log == 4
    report = saga_cli(db.url, "versions", "--json")
    rows = {(r["name"], r["version"]): r for r in __import__("json").loads(report.stdout)}
    assert rows[("loan", 1)]["waiting"] == 2 and rows[("loan", 2)]["waiting"] == 4


class Charge(BaseModel):
    key: str


class Refund(BaseModel):
    key: str


def test_step_deadline_resends_then_compensates_the_step_in_doubt(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    class Data(BaseModel):
        key: str

    slow = Saga("slow", data=Data, retry=StepRetry(attempts=2))
    slow.remote(
        "charge",
        service="sleepy",
        command=Charge,
        compensate=Refund,
        deadline=timedelta(milliseconds=300),
    )
    registry = SagaRegistry("slowhome")
    registry.register(slow)
    sleepy = Service("sleepy")

    @sleepy.handler(Charge)
    def charge(tx: Any, cmd: Charge, ctx: HandlerContext) -> None:
        tx.execute("INSERT INTO effects (kind, key) VALUES ('charge', %s)", (cmd.key,))

    @sleepy.handler(Refund)
    def refund(tx: Any, cmd: Refund, ctx: HandlerContext) -> None:
        tx.execute("INSERT INTO effects (kind, key) VALUES ('refund', %s)", (cmd.key,))

    with running_relay(db, rabbit), running_service(registry.as_service(), db, rabbit):
        with db.connect(autocommit=False) as conn, conn.transaction():
            saga_id = registry.start(conn, slow, Data(key="d1"))
        wait_until(
            lambda: db.scalar("SELECT status FROM saga.saga_instances") == "compensating",
            timeout=20,
            what="deadline passed twice",
        )
        with running_service(sleepy, db, rabbit):  # the participant comes back
            wait_until(
                lambda: db.scalar("SELECT status FROM saga.saga_instances") == "compensated",
                what="compensated",
            )
    assert effects(db, "d1") == ["charge", "refund"]  # the resent command applied once
    steps = db.rows(
        "SELECT outcome, attempt FROM saga.saga_steps WHERE saga_id = %s AND phase = 'forward' "
        "ORDER BY id",
        (saga_id,),
    )
    # the charge's reply came after the saga gave up on it; its compensation was on its way
    assert steps == [("deadline_exceeded", 1), ("deadline_exceeded", 2), ("ignored", 1)]


def test_claim_check_round_trip_and_expiry(db: TestDatabase) -> None:
    claims = ClaimCheck()
    document = {"pages": ["x" * 1000] * 300}
    with db.connect(autocommit=False) as conn:
        with conn.transaction():
            kept = claims.put_json(conn, document)
            expired = claims.put(conn, b"old", expires_in=timedelta(seconds=-1))
        with conn.transaction():
            assert claims.get_json(conn, kept) == document
        Pruner("saga").prune(conn)
        with conn.transaction():
            assert claims.get(conn, kept)
            with pytest.raises(ClaimNotFound):
                claims.get(conn, expired)
