"""Effects outside the database: the example's payments against its (fake) gateway."""

from __future__ import annotations

from pathlib import Path

import pytest

from saga import RetryPolicy, Service
from saga.examples.order_saga import invariants, payments, workload
from saga.examples.order_saga.cluster import Cluster
from saga.examples.order_saga.gateway import GatewayClient, GatewayServer
from saga.examples.order_saga.messages import ChargeCard
from saga.examples.order_saga.processes import REPO
from saga.messaging.envelope import Envelope
from tests.rig.supervisor import Supervisor
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.example_cluster import settle
from tests.support.running import running_relay, running_service
from tests.support.wait import wait_until


def test_payments_killed_after_the_gateway_answered_does_not_charge_twice(
    order_system: Cluster, tmp_path: Path
) -> None:
    orders = workload.make_orders(12, workload.FailureRates(0, 0, 0, 0), prefix="kill")
    # the first charge: the gateway call returns, then the payments worker is SIGKILLed
    # before it records the outcome or commits; it restarts without the fault
    supervisor = Supervisor(order_system.commands(), tmp_path, faults="side_effect.after_call@1")
    try:
        workload.submit(order_system, orders)
        settle(order_system, supervisor, len(orders))
        calls = GatewayClient(order_system.gateway_url).calls()
    finally:
        supervisor.stop()
    assert supervisor.fired()["side_effect.after_call"] == 1
    assert supervisor.restarts["payments"] == 1
    assert workload.status_counts(order_system) == {"completed": len(orders)}
    charges = {k: n for k, n in calls.items() if k.endswith(":charge_payment")}
    assert len(charges) == len(orders) and set(charges.values()) == {1}
    report = invariants.check(order_system)
    assert report.ok, report.violations


def test_a_replayed_payment_uses_the_original_idempotency_key(
    db: TestDatabase, rabbit: TestBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    db.execute((Path(REPO) / "examples/order_saga/schema/payments.sql").read_text())
    quick = Service("payments", retry=RetryPolicy(immediate_attempts=1, delays=()))
    quick.add_handler(ChargeCard, payments.charge_card)
    key = "01b00000-0000-7000-8000-000000000001:charge_payment"
    command = Envelope.wrap(
        ChargeCard(order_id="o-1", amount_cents=990, card_token="tok_ok"),
        headers={"idempotency_key": key},
        reply_to="orders",
    )
    cluster = Cluster({"payments": db.url}, rabbit.url)  # a free port: the gateway is down
    monkeypatch.setenv("PAYMENT_GATEWAY_URL", cluster.gateway_url)
    with running_service(quick, db, rabbit), running_relay(db, rabbit):
        rabbit.publish_raw("payments", command.to_bytes(), "application/json")
        wait_until(lambda: db.scalar("SELECT count(*) FROM saga.dead_letters") == 1, what="dlq")
        letter = db.scalar("SELECT id FROM saga.dead_letters")
        up = GatewayServer(cluster.gateway_port).start()  # the gateway is back
        try:
            replay = saga_cli(db.url, "dlq", "replay", str(letter))
            assert replay.returncode == 0, replay.stderr
            wait_until(lambda: db.scalar("SELECT count(*) FROM charges") == 1, what="replayed")
            assert GatewayClient(up.url).calls() == {key: 1}
        finally:
            up.stop()
    assert db.scalar("SELECT id FROM charges") == key
