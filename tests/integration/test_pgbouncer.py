"""The relay, the consumers, the orchestrator and the CLI through PgBouncer in transaction
mode (Debian's 1.18: a server connection serves another client after every transaction,
and prepared statements do not follow a client from one to the next)."""

from __future__ import annotations

import json
from contextlib import ExitStack
from typing import Any

import psycopg
import pytest

from saga import Outbox
from saga.db.connections import DIRECT, POOLED_POLLING
from tests.rig.pgbouncer_server import PgBouncerServer
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.running import running_relay, running_service
from tests.support.sagas import EFFECTS_DDL, TripData, bank, registry, trip
from tests.support.services import Hop, service
from tests.support.wait import wait_until

CHAINS, HOPS = 12, 8
POOLED_ENV = {"SAGA_POOLER": "transaction", "SAGA_WAKEUPS": "poll"}


def test_prepared_statements_break_behind_pgbouncer_in_transaction_mode(
    db: TestDatabase, pgbouncer: PgBouncerServer
) -> None:
    """Why the setting exists: two clients preparing statements (psycopg names them
    ``_pg3_0``, ``_pg3_1``... per connection) meet on one server connection."""
    url = pgbouncer.url_for(db.url)
    with (
        DIRECT.connect(url, autocommit=True) as one,
        DIRECT.connect(url, autocommit=True) as two,
        pytest.raises(
            (psycopg.errors.DuplicatePreparedStatement, psycopg.errors.InvalidSqlStatementName)
        ),
    ):
        for i in range(5):
            one.execute("SELECT %s::int", (i,), prepare=True)
            two.execute("SELECT %s::text", (str(i),), prepare=True)


def test_chains_of_hops_through_pgbouncer_two_relays_two_workers(
    db: TestDatabase, rabbit: TestBroker, pgbouncer: PgBouncerServer
) -> None:
    """Consumers (inbox, outbox, publish after commit) and relays, all through the pooler:
    every hop handled once, in order within its chain."""
    db.execute(EFFECTS_DDL)
    url = pgbouncer.url_for(db.url)
    with ExitStack() as stack:
        for name in ("relay-a", "relay-b"):
            stack.enter_context(
                running_relay(db, rabbit, database_url=url, name=name, database=POOLED_POLLING)
            )
        stack.enter_context(
            running_service(
                service, db, rabbit, database_url=url, concurrency=2, database=POOLED_POLLING
            )
        )
        with POOLED_POLLING.connect(url) as conn, conn.transaction():
            for chain in range(CHAINS):
                Outbox().add(
                    conn, Hop(chain=f"c{chain}", seq=1, last=HOPS), destination=service.name
                )
        wait_until(
            lambda: db.scalar("SELECT count(*) FROM effects WHERE kind = 'hop'") == CHAINS * HOPS,
            timeout=60,
            what="every hop of every chain",
        )
    rows = db.rows("SELECT key, array_agg(seq ORDER BY id) FROM effects GROUP BY key")
    assert {key: seqs for key, seqs in rows} == {
        f"c{chain}": list(range(1, HOPS + 1)) for chain in range(CHAINS)
    }
    assert db.scalar("SELECT count(*) FROM saga.dead_letters") == 0


def test_sagas_and_the_cli_through_pgbouncer(
    db: TestDatabase, rabbit: TestBroker, pgbouncer: PgBouncerServer
) -> None:
    """The orchestrator and a participant through the pooler; then ``saga show`` and
    ``saga stats`` twice each (a second process lands on the server connection the first
    one prepared its statements on)."""
    db.execute(EFFECTS_DDL)
    url = pgbouncer.url_for(db.url)
    options: dict[str, Any] = {"database_url": url, "database": POOLED_POLLING}
    with ExitStack() as stack:
        stack.enter_context(running_relay(db, rabbit, **options))
        stack.enter_context(running_service(registry.as_service(), db, rabbit, **options))
        stack.enter_context(running_service(bank, db, rabbit, **options))
        with POOLED_POLLING.connect(url) as conn, conn.transaction():
            ids = [trip.start(conn, TripData(trip_id=f"t{i}")) for i in range(6)]
        wait_until(
            lambda: (
                db.scalar("SELECT count(*) FROM saga.saga_instances WHERE status = 'completed'")
                == len(ids)
            ),
            timeout=60,
            what="every saga completed",
        )
    for _ in range(2):
        shown = saga_cli(url, "show", str(ids[0]), **POOLED_ENV)
        assert shown.returncode == 0, shown.stderr
        assert "completed" in shown.stdout
        stats = saga_cli(url, "stats", "--json", **POOLED_ENV)
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["counts"]


def test_contradictory_pooler_settings_are_refused_by_the_cli(
    db: TestDatabase, pgbouncer: PgBouncerServer
) -> None:
    refused = saga_cli(pgbouncer.url_for(db.url), "relay", SAGA_POOLER="transaction",
                       SAGA_BROKER_URL="amqp://guest:guest@127.0.0.1:5672//")  # fmt: skip
    assert refused.returncode != 0
    assert "SAGA_LISTEN_DATABASE_URL" in refused.stderr + refused.stdout
