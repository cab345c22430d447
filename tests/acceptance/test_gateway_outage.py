"""A payment gateway outage longer than the retries, handled the way the docs tell operators.

Every charge becomes a dead letter in the payments database. Held (the example's
default), each saga waits at ``charge_payment`` until the operator replays the
letters: then every order completes with exactly one charge. Compensating, the
sagas undo the charge step too (a charge may have gone through with its answer
lost: it is refunded), and the replay runs no charge, since the saga moved on.
"""

from __future__ import annotations

import json
from pathlib import Path

from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import Cluster
from saga.examples.order_saga.gateway import GatewayClient
from tests.rig.checker import check
from tests.rig.supervisor import Supervisor
from tests.support.cli import saga_cli
from tests.support.example_cluster import gateway_answers, settle
from tests.support.wait import wait_until

ORDERS = 20
LOST_ANSWERS = 5  # charges the gateway makes before the outage, dropping the connection


def _start(system: Cluster, tmp_path: Path, on_dead_letter: str) -> Supervisor:
    system.extra_env.update(
        {"PAYMENTS_RETRY_DELAYS": "0.2,0.4", "ORDERS_CHARGE_ON_DEAD_LETTER": on_dead_letter}
    )
    supervisor = Supervisor(system.commands(), tmp_path)
    gateway = GatewayClient(system.gateway_url)
    wait_until(lambda: gateway_answers(gateway), timeout=30, what="the payment gateway")
    return supervisor


def _every_charge_dead_lettered(system: Cluster) -> bool:
    with system.connect("payments") as conn:
        row = conn.execute(
            "SELECT count(*) FROM saga.dead_letters WHERE message_type = 'ChargeCard'"
        ).fetchone()
    return bool(row and row[0] == ORDERS)


def test_held_sagas_complete_with_one_charge_each_after_the_replay(
    order_system: Cluster, tmp_path: Path
) -> None:
    orders = workload.make_orders(ORDERS, workload.FailureRates(0, 0, 0, 0), prefix="held")
    payments_db, orders_db = (
        order_system.database_urls["payments"],
        order_system.database_urls["orders"],
    )
    supervisor = _start(order_system, tmp_path, "hold")
    gateway = GatewayClient(order_system.gateway_url)
    try:
        gateway.set_faults(charges_down=True)
        workload.submit(order_system, orders)
        wait_until(
            lambda: workload.status_counts(order_system) == {"step_dead_lettered": ORDERS},
            timeout=120,
            what="every saga held at charge_payment",
        )
        stats = json.loads(saga_cli(orders_db, "stats", "--json").stdout)
        assert stats["counts"]["create_order"] == {"step_dead_lettered": ORDERS}, stats
        held = json.loads(
            saga_cli(orders_db, "list", "--status", "step_dead_lettered", "--json").stdout
        )
        assert len(held) == ORDERS and {h["step"] for h in held} == {"charge_payment"}, held
        shown = saga_cli(orders_db, "show", held[0]["id"]).stdout
        assert "held at charge_payment" in shown and "dead-lettered" in shown, shown
        dry = saga_cli(
            payments_db, "dlq", "replay", "--consumer", "payments", "--dry-run",
            "--home-database-url", orders_db,
        )  # fmt: skip
        assert dry.returncode == 0, dry.stderr
        assert f"{ORDERS} of {ORDERS} dead letter(s) would be replayed" in dry.stdout, dry.stdout
        assert dry.stdout.count("step_dead_lettered at charge_payment") == ORDERS, dry.stdout
        gateway.set_faults(charges_down=False)  # the operator fixed the gateway
        replay = saga_cli(payments_db, "dlq", "replay", "--consumer", "payments")
        assert replay.returncode == 0, replay.stderr
        settle(order_system, supervisor, ORDERS)
        state = gateway.state()
    finally:
        supervisor.stop()
    assert workload.status_counts(order_system) == {"completed": ORDERS}
    charges = [c for c in state["charges"].values() if c["status"] == "succeeded"]
    assert len(charges) == ORDERS and state["refunds"] == {}
    report = check(order_system, state)
    assert report.ok, report.violations


def test_compensated_sagas_refund_lost_charges_and_replay_charges_no_one(
    order_system: Cluster, tmp_path: Path
) -> None:
    orders = workload.make_orders(ORDERS, workload.FailureRates(0, 0, 0, 0), prefix="comp")
    payments_db = order_system.database_urls["payments"]
    supervisor = _start(order_system, tmp_path, "compensate")
    gateway = GatewayClient(order_system.gateway_url)
    try:
        gateway.set_faults(charges_down=True, drop_charges=LOST_ANSWERS)
        workload.submit(order_system, orders)
        settle(order_system, supervisor, ORDERS)
        assert _every_charge_dead_lettered(order_system)
        gateway.set_faults(charges_down=False)
        dry = saga_cli(payments_db, "dlq", "replay", "--consumer", "payments", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert f"0 of {ORDERS} dead letter(s) would be replayed" in dry.stdout, dry.stdout
        assert dry.stdout.count("skipped, superseded") == ORDERS, dry.stdout
        replay = saga_cli(payments_db, "dlq", "replay", "--consumer", "payments")
        assert replay.returncode == 1 and "superseded" in replay.stdout, replay.stdout
        forced = saga_cli(payments_db, "dlq", "replay", "--consumer", "payments", "--force")
        assert forced.returncode == 0, forced.stderr
        wait_until(
            lambda: _refused(order_system) == ORDERS, timeout=60, what="forced replays refused"
        )
        settle(order_system, supervisor, ORDERS)
        state = gateway.state()
    finally:
        supervisor.stop()
    assert workload.status_counts(order_system) == {"compensated": ORDERS}
    made = [c for c in state["charges"].values() if c["status"] == "succeeded"]
    assert len(made) == LOST_ANSWERS  # only the charges whose answers were lost...
    assert len(state["refunds"]) == LOST_ANSWERS  # ...and each of them refunded
    report = check(order_system, state)
    assert report.ok, report.violations


def _refused(system: Cluster) -> int:
    """Forced replays the payments service refused (their step was closed), per the sagas."""
    with system.connect("orders") as conn:
        row = conn.execute(
            "SELECT count(*) FROM saga.saga_steps WHERE outcome = 'ignored' AND error LIKE %s",
            ("%step_closed%",),
        ).fetchone()
    return int(row[0]) if row else 0
