"""A saga definition changed under the same version while sagas of it run: refused at start.

The registry records each version's shape when its consumer connects. A later consumer
whose version 1 renamed a step (no version bump) would strand the sagas waiting at the
old name; it refuses to start, naming the saga, the version and the change. With a
version bump, or once nothing of that version is unfinished, it starts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from uuid import UUID

import pytest

from tests.support import loans
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.running import running_relay, running_service
from tests.support.services import EFFECTS_DDL
from tests.support.wait import wait_until


def _steps(db: TestDatabase, version: int) -> list[str]:
    steps = db.scalar(
        "SELECT steps FROM saga.saga_definitions WHERE name = 'loan' AND version = %s",
        (version,),
    )
    return [step["step"] for step in steps]


@pytest.fixture
def waiting_loans(db: TestDatabase, rabbit: TestBroker) -> Iterator[list[UUID]]:
    """Two version-1 loans waiting at wait_approval, their consumers stopped since."""
    db.execute(EFFECTS_DDL)
    with (
        running_relay(db, rabbit),
        running_service(loans.registry_v1.as_service(), db, rabbit),
        running_service(loans.bureau, db, rabbit),
    ):
        with db.connect(autocommit=False) as conn, conn.transaction():
            ids = [loans.registry_v1.start(conn, "loan", loans.LoanData(loan_id=f"l{i}"))
                   for i in range(2)]  # fmt: skip
        wait_until(
            lambda: (
                db.scalar("SELECT count(*) FROM saga.saga_instances WHERE step = 'wait_approval'")
                == 2
            ),
            what="both loans waiting for approval",
        )
    yield ids


def test_a_step_renamed_without_a_version_bump_is_refused_while_sagas_of_it_run(
    db: TestDatabase, rabbit: TestBroker, waiting_loans: list[UUID]
) -> None:
    assert "wait_approval" in _steps(db, 1)  # recorded by the first consumer
    refused = saga_cli(
        db.url, "consume", "tests.support.loans:registry_v1_edited", SAGA_BROKER_URL=rabbit.url
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    message = " ".join(refused.stderr.split())
    assert (
        "saga 'loan' version 1 changed without a version bump while 2 saga(s) of it are "
        "unfinished: step(s) 'wait_approval' removed or renamed; step(s) 'await_approval' "
        "added. Give the changed definition version 2"
    ) in message, message
    assert "wait_approval" in _steps(db, 1)  # the record stays what the running sagas need
    # Bumped instead (version 1 kept as it was): it starts, and records version 2.
    with running_service(loans.registry_v2.as_service(), db, rabbit):
        pass
    assert "compliance_check" in _steps(db, 2) and "compliance_check" not in _steps(db, 1)
    report = json.loads(saga_cli(db.url, "versions", "--json").stdout)
    assert [(row["version"], len(row["definition"])) for row in report] == [(1, 16)]


def test_once_nothing_of_the_version_is_unfinished_a_changed_definition_is_recorded(
    db: TestDatabase, rabbit: TestBroker, waiting_loans: list[UUID]
) -> None:
    db.execute(
        "UPDATE saga.saga_instances SET status = 'compensated', finished_at = now(), "
        "step_state = '{}'"
    )
    with running_service(loans.registry_v1_edited.as_service(), db, rabbit):
        pass
    assert "await_approval" in _steps(db, 1) and "wait_approval" not in _steps(db, 1)
