"""The invariant checker: run it against the example's databases, on its own.

    python -m tests.rig.checker --database-url 'postgresql://localhost/chaos_{service}'

It classifies every command a saga sent as delivered, lost, duplicated (its
effect applied more than once) or unexpected (an effect no saga step accounts
for), checks that every saga is finished (or visibly needs an operator), that
each saga's steps ran in order, that every outbox is drained, and that money
and stock add up. It prints the figures and exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from typing import Any

from saga.examples.order_saga import invariants
from saga.examples.order_saga.cluster import SERVICES, Cluster
from saga.examples.order_saga.orders import registry

#: Remote step -> (service, table holding one row per applied command, keyed by idempotency key).
#: A fan-out's items are keyed ``<saga>:<step>:<position>:<sku>``, and count for their step.
EFFECTS = {
    "reserve_stock": ("inventory", "stock_reservations"),
    "reserve_lines": ("inventory", "stock_reservations"),
    "reserve_credit": ("customers", "credit_reservations"),
    "charge_payment": ("payments", "charges"),
    "schedule_shipment": ("inventory", "shipments"),
}


def positions(version: int) -> dict[str, int]:
    """Each step's place in the create_order saga at ``version``; the members of a parallel
    group share their group's place (they answer in any order)."""
    saga = registry.definition("create_order", version)
    return {part.name: i for i, step in enumerate(saga.steps) for part in step.parts()}


def classify(system: Cluster, report: invariants.Report) -> None:
    """Delivered, lost, duplicated and unexpected commands, from the step log and the effects.

    An effect is expected when its step succeeded, when the saga compensated the step
    (a step whose outcome was unknown is compensated too, and may have had its effect), or
    when it succeeded after the saga had compensated past it (a parallel group's member,
    or a fan-out member's item, still out when a sibling failed: the late success is logged
    and undone). A fan-out's items count for their step: each applied once, the step
    delivered when its items are.
    """
    logged: dict[str, set[str]] = defaultdict(set)
    for saga_id, step, phase, outcome in invariants.rows(
        system,
        "orders",
        "SELECT saga_id, step, phase, outcome FROM saga.saga_steps "
        "WHERE outcome IN ('succeeded', 'late_success')",
    ):
        if step in EFFECTS:
            logged[outcome if outcome == "late_success" else phase].add(f"{saga_id}:{step}")
    succeeded = logged["forward"]
    applied: Counter[str] = Counter()
    for service, table in set(EFFECTS.values()):
        query = f"SELECT id, count(*) FROM {table} GROUP BY id"
        for key, count in invariants.rows(system, service, query):
            applied[key] += count
    steps_applied = {_step_key(key) for key in applied}
    delivered = sum(1 for key in succeeded if key in steps_applied)
    lost = [key for key in succeeded if key not in steps_applied]
    duplicated = [key for key, count in applied.items() if count > 1]
    expected = succeeded | logged["compensation"] | logged["late_success"]
    unexpected = [key for key in applied if _step_key(key) not in expected]
    running = {
        str(r[0])
        for r in invariants.rows(
            system,
            "orders",
            "SELECT id FROM saga.saga_instances WHERE status IN ('running', 'compensating')",
        )
    }
    unexpected = [key for key in unexpected if key.split(":")[0] not in running]
    report.figures.update(
        commands_delivered=delivered,
        commands_lost=len(lost),
        effects_duplicated=len(duplicated),
        effects_unexpected=len(unexpected),
    )
    if lost:
        report.violations.append(f"{len(lost)} commands lost, e.g. {lost[:3]}")
    if duplicated:
        report.violations.append(f"{len(duplicated)} effects applied twice, e.g. {duplicated[:3]}")
    if unexpected:
        report.violations.append(f"{len(unexpected)} unexpected effects, e.g. {unexpected[:3]}")


def _step_key(key: str) -> str:
    """The step key (``<saga>:<step>``) an effect's idempotency key belongs to."""
    return ":".join(key.split(":", 2)[:2])


def step_order(system: Cluster, report: invariants.Report) -> None:
    """Forward steps in definition order, then compensations in reverse, per saga (the
    members of a parallel group in any order among themselves). A step that succeeded
    after the saga had compensated past it (a late success) is undone when its success
    comes, whatever the order: its compensation is left out of the reverse-order check."""
    log: dict[Any, list[tuple[str, str]]] = defaultdict(list)
    late: dict[Any, set[str]] = defaultdict(set)
    version_of: dict[Any, int] = {}
    for saga_id, version, step, phase, outcome in invariants.rows(
        system,
        "orders",
        "SELECT s.saga_id, i.saga_version, s.step, s.phase, s.outcome FROM saga.saga_steps s "
        "JOIN saga.saga_instances i ON i.id = s.saga_id "
        "WHERE s.outcome IN ('succeeded', 'late_success') ORDER BY s.saga_id, s.id",
    ):
        version_of[saga_id] = version
        if outcome == "late_success":
            late[saga_id].add(step)
        else:
            log[saga_id].append((step, phase))
    places = {version: positions(version) for version in set(version_of.values())}
    bad = []
    for saga_id, entries in log.items():
        place = places[version_of[saga_id]]
        forward = [s for s, p in entries if p == "forward"]
        backward = [s for s, p in entries if p == "compensation" and s not in late[saga_id]]
        first_compensation = next((i for i, (_, p) in enumerate(entries) if p != "forward"), None)
        in_order = forward == sorted(forward, key=place.__getitem__)
        reverse = backward == sorted(backward, key=place.__getitem__, reverse=True)
        no_forward_after = first_compensation is None or all(
            p == "compensation" for _, p in entries[first_compensation:]
        )
        if not (in_order and reverse and no_forward_after):
            bad.append(saga_id)
    report.figures["sagas_out_of_order"] = len(bad)
    if bad:
        report.violations.append(f"{len(bad)} sagas ran steps out of order, e.g. {bad[:3]}")


def drained(system: Cluster, report: invariants.Report) -> None:
    """No ready message left in any outbox, no pending dead letter."""
    ready = letters = 0
    for service in system.services:
        ready += invariants.rows(
            system, service, "SELECT count(*) FROM saga.outbox WHERE deliver_after IS NULL"
        )[0][0]
        letters += invariants.rows(
            system, service, "SELECT count(*) FROM saga.dead_letters WHERE status = 'pending'"
        )[0][0]
    report.figures.update(outbox_ready=ready, dead_letters_pending=letters)
    if ready:
        report.violations.append(f"{ready} messages still waiting in the outboxes")
    if letters:
        report.violations.append(f"{letters} dead letters need an operator")


def check(system: Cluster, gateway: dict[str, Any] | None = None) -> invariants.Report:
    report = invariants.check(system, gateway)
    classify(system, report)
    step_order(system, report)
    drained(system, report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url",
        required=True,
        help="URL with a {service} placeholder, e.g. postgresql://localhost/chaos_{service}",
    )
    args = parser.parse_args(argv)
    system = Cluster({s: args.database_url.format(service=s) for s in SERVICES}, "memory://")
    report = check(system)
    for key, value in sorted(report.figures.items()):
        print(f"{key}: {value}")
    for violation in report.violations:
        print(f"VIOLATION: {violation}")
    print("checker: ok" if report.ok else f"checker: {len(report.violations)} violation(s)")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
