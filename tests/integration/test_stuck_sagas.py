"""What a chaos run prints for a saga that did not finish: the message it awaits, and
where that message and its saga's rows are."""

from __future__ import annotations

import uuid

from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import Cluster
from tests.rig.stuck_sagas import describe_stuck


def test_a_stuck_saga_is_described_by_the_traces_of_the_message_it_awaits(
    order_system: Cluster,
) -> None:
    orders = workload.make_orders(2, workload.FailureRates(0, 0, 0, 0), max_lines=1)
    workload.submit(order_system, orders)  # nothing runs: each waits on its first command
    *lines, queues = describe_stuck(order_system)
    assert len(lines) == 2
    assert queues.startswith("messages ready in the queues: {")
    assert all(
        "running at reserve" in line
        and "(reserve_lines, reserve_credit)" in line  # both members of the group are out
        and "handled by no inbox" in line
        and "outbox rows {'orders': 2}" in line
        and "dead letters none" in line
        for line in lines
    ), lines

    with order_system.connect("orders") as conn:
        row = conn.execute(
            "SELECT id, pending_message_id FROM saga.saga_instances ORDER BY updated_at LIMIT 1"
        ).fetchone()
        assert row is not None
        saga_id, pending = row
        conn.execute("DELETE FROM saga.outbox WHERE saga_id = %s", (saga_id,))
    with order_system.connect("inventory") as conn:
        conn.execute(
            "INSERT INTO saga.inbox (consumer, message_id, received_at) VALUES (%s, %s, now())",
            ("inventory", pending),
        )
        conn.execute(
            "INSERT INTO saga.dead_letters (consumer, reason, message_id, saga_id, body, "
            "error_type, error_message) VALUES ('inventory', 'failed', %s, %s, '', 'E', 'e')",
            (uuid.uuid4(), saga_id),
        )
    described = next(line for line in describe_stuck(order_system) if str(saga_id) in line)
    assert "handled by ['inventory']" in described
    assert "outbox rows none" in described
    assert "dead letters {'inventory': 1}" in described
