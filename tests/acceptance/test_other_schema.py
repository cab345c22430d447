"""The whole runtime on a schema other than ``saga``: migrate, relay, consumers, the CLI.

The database starts empty, so a single table or statement that ignored the schema
(``saga.`` written out, a default left in place) fails: there is no ``saga`` schema
to fall back on, and the test checks none was created.
"""

from __future__ import annotations

import json
from pathlib import Path

from saga.examples.order_saga.processes import SagaProcess, saga_env
from tests.support import elsewhere
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.services import EFFECTS_DDL
from tests.support.wait import wait_until

SCHEMA = elsewhere.SCHEMA


def _statuses(db: TestDatabase) -> dict[str, str]:
    rows = db.rows(f"SELECT data ->> 'invoice_id', status FROM {SCHEMA}.saga_instances")
    return dict(rows)  # type: ignore[arg-type]


def test_relay_consumers_and_cli_work_on_another_schema(
    empty_db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    db = empty_db
    cli_env = {"SAGA_SCHEMA": SCHEMA}
    migrated = saga_cli(db.url, "db", "migrate", **cli_env)
    assert migrated.returncode == 0, migrated.stderr
    db.execute(EFFECTS_DDL)
    rabbit.use("billing", "ledger")
    env = saga_env(db.url, rabbit.url, rabbit.topology.queue_prefix, SAGA_SCHEMA=SCHEMA)
    processes = [
        SagaProcess(["relay"], env, tmp_path, "relay"),
        SagaProcess(["consume", "tests.support.elsewhere:registry"], env, tmp_path, "billing"),
        SagaProcess(["consume", "tests.support.elsewhere:ledger"], env, tmp_path, "ledger"),
    ]
    try:
        with db.connect(autocommit=False) as conn, conn.transaction():
            for invoice_id in ("paid-1", "paid-2", "refused-1"):
                elsewhere.invoice.start(conn, elsewhere.Invoice(invoice_id=invoice_id))
        wait_until(
            lambda: (
                _statuses(db)
                == {"paid-1": "completed", "paid-2": "completed", "refused-1": "compensated"}
            ),
            timeout=60,
            what="every invoice saga at its end",
        )
        rabbit.publish_raw("ledger", b"not a message", "application/json")  # a dead letter
        wait_until(
            lambda: db.scalar(f"SELECT count(*) FROM {SCHEMA}.dead_letters") == 1,
            what="the junk dead-lettered in the other schema",
        )
        wait_until(lambda: db.scalar(f"SELECT count(*) FROM {SCHEMA}.outbox") == 0, what="drained")
    finally:
        codes = {process.name: process.terminate(60) for process in processes}
    assert codes == {"relay": 0, "billing": 0, "ledger": 0}, [p.output() for p in processes]
    assert db.rows("SELECT kind, count(*) FROM effects GROUP BY kind ORDER BY kind") == [
        ("cancel", 1),
        ("charge", 2),
        ("open", 3),
    ]
    saga_id = db.scalar(
        f"SELECT id FROM {SCHEMA}.saga_instances WHERE data ->> 'invoice_id' = 'refused-1'"
    )
    listed = saga_cli(db.url, "list", "--json", **cli_env)
    assert listed.returncode == 0, listed.stderr
    assert sorted(row["status"] for row in json.loads(listed.stdout)) == [
        "compensated",
        "completed",
        "completed",
    ]
    shown = saga_cli(db.url, "show", str(saga_id), **cli_env)
    assert shown.returncode == 0 and "compensated" in shown.stdout, shown.stderr
    stats = saga_cli(db.url, "stats", "--json", **cli_env)
    assert json.loads(stats.stdout)["counts"]["invoice"] == {"completed": 2, "compensated": 1}
    letters = saga_cli(db.url, "dlq", "list", "--json", **cli_env)
    assert [letter["error_type"] for letter in json.loads(letters.stdout)] == ["UndecodableBody"]
    status = saga_cli(db.url, "db", "status", **cli_env)
    assert status.returncode == 0 and "0 pending" in status.stdout, status.stdout
    pruned = saga_cli(db.url, "db", "prune", "--dry-run", **cli_env)
    assert pruned.returncode == 0, pruned.stderr
    assert db.scalar("SELECT to_regnamespace('saga') IS NULL")  # nothing fell back on saga


def test_a_registry_on_one_schema_refuses_a_consumer_on_another(
    empty_db: TestDatabase, rabbit: TestBroker
) -> None:
    refused = saga_cli(
        empty_db.url,
        "consume",
        "tests.support.elsewhere:registry",
        SAGA_BROKER_URL=rabbit.url,
    )  # no SAGA_SCHEMA: the consumer would run on saga, the registry keeps billing_fw
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"keeps its sagas in schema {SCHEMA!r}" in refused.stderr.replace("\n", " ")
