"""Business invariants of the example: money and stock add up, no effect applied twice,
every decided order notified once and counted once."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from saga.examples.order_saga.cluster import Cluster


@dataclass
class Report:
    figures: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def rows(system: Cluster, service: str, query: str) -> list[tuple[Any, ...]]:
    """All rows of ``query`` on one service's database."""
    with system.connect(service) as conn:
        return conn.execute(query).fetchall()


def check(system: Cluster, gateway: dict[str, Any] | None = None) -> Report:
    """The business invariants; with the payment gateway's state (``GatewayClient.state()``),
    also that the money at the gateway matches: no rejected order keeps a charge there."""
    report = Report()
    sagas = dict(
        rows(system, "orders", "SELECT data->>'order_id', status FROM saga.saga_instances")
    )
    orders = {
        r[0]: (r[1], r[2], r[3])
        for r in rows(system, "orders", "SELECT id, status, customer_id, amount_cents FROM orders")
    }
    for status in ("completed", "compensated", "running", "compensating"):
        report.figures[f"sagas_{status}"] = sum(1 for s in sagas.values() if s == status)
    bad = {o: s for o, s in sagas.items() if s not in ("completed", "compensated")}
    if bad:
        report.violations.append(f"{len(bad)} sagas are not finished, e.g. {list(bad.items())[:3]}")
    expected = {"completed": "approved", "compensated": "rejected"}
    for order_id, status in sagas.items():
        if status in expected and orders.get(order_id, ("missing",))[0] != expected[status]:
            report.violations.append(
                f"order {order_id}: saga {status} but order {orders.get(order_id)}"
            )
    approved = {o for o, (s, _, _) in orders.items() if s == "approved"}
    rejected = {o for o, (s, _, _) in orders.items() if s == "rejected"}
    _check_credit(system, report, orders, approved)
    _check_stock(system, report, approved, rejected)
    _check_payments(system, report, orders, approved, rejected)
    if system.has_subscribers:
        _check_events(system, report, orders, approved, rejected)
    if gateway is not None:
        _check_gateway(system, report, gateway, approved, rejected)
    return report


def _duplicates(system: Cluster, service: str, table: str, report: Report) -> None:
    dup = rows(system, service, f"SELECT id, count(*) FROM {table} GROUP BY id HAVING count(*) > 1")
    report.figures[f"duplicate_{table}"] = len(dup)
    if dup:
        report.violations.append(f"{table}: effect applied twice for {dup[:3]}")


def _check_credit(
    system: Cluster, report: Report, orders: dict[str, Any], approved: set[str]
) -> None:
    _duplicates(system, "customers", "credit_reservations", report)
    held = dict(
        rows(
            system,
            "customers",
            "SELECT order_id, sum(amount_cents) FROM credit_reservations "
            "WHERE status = 'reserved' GROUP BY order_id",
        )
    )
    expected = {o: orders[o][2] for o in approved}
    if {k: int(v) for k, v in held.items()} != expected:
        report.violations.append("credit reserved does not match the completed orders' amounts")
    drift = rows(
        system,
        "customers",
        "SELECT c.customer_id FROM credit c LEFT JOIN (SELECT customer_id, sum(amount_cents) AS s "
        "FROM credit_reservations WHERE status = 'reserved' GROUP BY customer_id) r "
        "USING (customer_id) WHERE c.initial - c.available <> coalesce(r.s, 0)",
    )
    if drift:
        report.violations.append(f"credit balances drifted for {drift[:3]}")
    report.figures["credit_reserved_cents"] = sum(int(v) for v in held.values())


def _check_stock(system: Cluster, report: Report, approved: set[str], rejected: set[str]) -> None:
    """Every line of an approved order shipped (its sku and quantity, nothing more), a
    rejected order holding no stock, and each sku's level equal to what it started with less
    what is reserved or shipped."""
    _duplicates(system, "inventory", "stock_reservations", report)
    _duplicates(system, "inventory", "shipments", report)
    held: dict[str, Counter[tuple[str, str]]] = {}
    for order, sku, quantity, status in rows(
        system, "inventory", "SELECT order_id, sku, quantity, status FROM stock_reservations"
    ):
        if status != "released":
            held.setdefault(order, Counter())[(sku, status)] += quantity
    ordered = _lines_ordered(system)
    for order in approved:
        shipped = Counter({(sku, "shipped"): n for sku, n in ordered.get(order, {}).items()})
        if held.get(order) != shipped:
            report.violations.append(
                f"approved order {order} ordered {ordered.get(order)} but holds {held.get(order)}"
            )
    for order in rejected:
        if held.get(order):
            report.violations.append(f"rejected order {order} still holds stock ({held[order]})")
    drift = rows(
        system,
        "inventory",
        "SELECT s.sku FROM stock s LEFT JOIN (SELECT sku, sum(quantity) AS q "
        "FROM stock_reservations WHERE status IN ('reserved', 'shipped') GROUP BY sku) r "
        "USING (sku) "
        "WHERE s.initial - s.available <> coalesce(r.q, 0)",
    )
    if drift:
        report.violations.append(f"stock levels drifted for {drift[:3]}")


def _lines_ordered(system: Cluster) -> dict[str, Counter[str]]:
    """Each order's quantity per sku, from its saga's data (its lines, or, for a saga begun
    before orders had lines and not written since, its one sku and quantity)."""
    ordered: dict[str, Counter[str]] = {}
    for order, lines, sku, quantity in rows(
        system,
        "orders",
        "SELECT data->>'order_id', data->'lines', data->>'sku', (data->>'quantity')::int "
        "FROM saga.saga_instances WHERE name = 'create_order'",
    ):
        wanted = ordered.setdefault(order, Counter())
        for line in lines or [{"sku": sku, "quantity": quantity}]:
            wanted[line["sku"]] += line["quantity"]
    return ordered


def _check_payments(
    system: Cluster, report: Report, orders: dict[str, Any], approved: set[str], rejected: set[str]
) -> None:
    _duplicates(system, "payments", "charges", report)
    charges = rows(system, "payments", "SELECT order_id, status, id FROM charges")
    refunds = rows(system, "payments", "SELECT charge_id, count(*) FROM refunds GROUP BY charge_id")
    per_order: dict[str, list[str]] = {}
    for order_id, status, _ in charges:
        per_order.setdefault(order_id, []).append(status)
    for order, statuses in per_order.items():
        if len(statuses) > 1:
            report.violations.append(f"order {order} charged {len(statuses)} times")
    for order in approved:
        if per_order.get(order) != ["charged"]:
            report.violations.append(f"approved order {order} has charges {per_order.get(order)}")
    for order in rejected:
        if per_order.get(order, ["refunded"]) != ["refunded"]:
            report.violations.append(f"rejected order {order} kept its charge")
    charge_ids = {c[2] for c in charges}
    for charge_id, count in refunds:
        if charge_id not in charge_ids:
            report.violations.append(f"refund without a charge: {charge_id}")
        if count > 1:
            report.violations.append(f"charge {charge_id} refunded {count} times")
    report.figures["charges"] = len(charges)
    report.figures["refunds"] = sum(c for _, c in refunds)


def _check_events(
    system: Cluster, report: Report, orders: dict[str, Any], approved: set[str], rejected: set[str]
) -> None:
    """The subscribers of orders' events: one notice per approved or rejected order (of its
    kind, none for an order still undecided), and analytics' totals equal to the approved
    orders' (an event handled twice would count twice)."""
    notices: dict[str, list[str]] = {}
    for order_id, kind in rows(system, "notifications", "SELECT order_id, kind FROM notices"):
        notices.setdefault(order_id, []).append(kind)
    expected = {o: ["approved"] for o in approved} | {o: ["rejected"] for o in rejected}
    twice = [o for o, kinds in notices.items() if len(kinds) > 1]
    missing = [o for o in expected if o not in notices]
    wrong = [o for o, kinds in notices.items() if o not in twice and kinds != expected.get(o)]
    report.figures.update(
        notices=sum(len(kinds) for kinds in notices.values()),
        notices_missing=len(missing),
        notices_duplicated=len(twice),
    )
    if twice:
        report.violations.append(f"{len(twice)} orders notified more than once, e.g. {twice[:3]}")
    if missing:
        report.violations.append(
            f"{len(missing)} decided orders never notified, e.g. {missing[:3]}"
        )
    if wrong:
        report.violations.append(f"{len(wrong)} notices do not match their order, e.g. {wrong[:3]}")
    counted = {
        customer: (int(n), int(cents))
        for customer, n, cents in rows(
            system, "analytics", "SELECT customer_id, orders, amount_cents FROM approved_totals"
        )
    }
    totals: dict[str, tuple[int, int]] = {}
    for order_id in approved:
        _, customer, amount = orders[order_id]
        n, cents = totals.get(customer, (0, 0))
        totals[customer] = (n + 1, cents + amount)
    report.figures["analytics_approved_cents"] = sum(cents for _, cents in counted.values())
    if counted != totals:
        drift = sorted(c for c in counted.keys() | totals.keys() if counted.get(c) != totals.get(c))
        report.violations.append(
            f"analytics totals differ from the approved orders for {len(drift)} customers, "
            f"e.g. {[(c, counted.get(c), totals.get(c)) for c in drift[:3]]}"
        )


def events_delivered(system: Cluster) -> bool:
    """True once every decided order has its notice and analytics counted every approved
    one (the subscribers have caught up with the events orders published), or when the
    cluster runs no subscriber."""
    if not system.has_subscribers:
        return True
    decided = rows(
        system, "orders", "SELECT count(*) FILTER (WHERE status IN ('approved', 'rejected')), "
        "count(*) FILTER (WHERE status = 'approved') FROM orders"
    )[0]  # fmt: skip
    notices = rows(system, "notifications", "SELECT count(DISTINCT order_id) FROM notices")[0][0]
    counted = rows(system, "analytics", "SELECT coalesce(sum(orders), 0) FROM approved_totals")
    return bool(notices >= decided[0] and counted[0][0] >= decided[1])


def _check_gateway(
    system: Cluster,
    report: Report,
    gateway: dict[str, Any],
    approved: set[str],
    rejected: set[str],
) -> None:
    """Money at the gateway: one kept charge per approved order, none per rejected order."""
    order_of = dict(
        rows(system, "orders", "SELECT id::text || ':charge_payment', data->>'order_id' "
             "FROM saga.saga_instances")
    )  # fmt: skip
    refunded = {refund["charge"] for refund in gateway["refunds"].values()}
    kept: dict[str, int] = {}
    for key, charge in gateway["charges"].items():
        if charge["status"] == "succeeded" and charge["id"] not in refunded:
            order = order_of.get(key, key)
            kept[order] = kept.get(order, 0) + 1
    for order in rejected:
        if kept.get(order):
            report.violations.append(f"rejected order {order} keeps a charge at the gateway")
    for order in approved:
        if kept.get(order) != 1:
            report.violations.append(
                f"approved order {order} has {kept.get(order, 0)} charges kept at the gateway"
            )
    report.figures["gateway_charges_kept"] = sum(kept.values())
    report.figures["gateway_refunds"] = len(refunded)
