"""A fan-out, event by event: one command per item under its own key, at most the cap out
at once, results gathered by the reducer, only the items that took effect undone, and
mistakes refused at registration or reported when the saga reaches the step."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from saga import Saga
from saga.engine.fingerprints import fingerprint, shape
from saga.errors import ConfigurationError
from saga.messaging.envelope import COMPENSATES_HEADER, IDEMPOTENCY_KEY_HEADER
from saga.testing import SagaScenario


class Line(BaseModel):
    sku: str
    qty: int


class Order(BaseModel):
    lines: list[Line] = []
    reserved: dict[str, str] = {}


class ReserveLine(BaseModel):
    sku: str
    qty: int


class LineReserved(BaseModel):
    reservation: str


class ReleaseLine(BaseModel):
    sku: str


class CreateOrder(BaseModel):
    pass


class CancelOrder(BaseModel):
    pass


def order_saga(*, cap: int = 2) -> Saga[Order]:
    saga = Saga("order", data=Order)
    saga.remote("create", service="orders", command=CreateOrder, compensate=CancelOrder)
    saga.for_each(
        "reserve_lines",
        items=lambda d: d.lines,
        service="stock",
        command=lambda d, line: ReserveLine(sku=line.sku, qty=line.qty),
        reply=LineReserved,
        on_reply=lambda d, line, r: d.model_copy(
            update={"reserved": {**d.reserved, line.sku: r.reservation}}
        ),
        compensate=lambda d, line: ReleaseLine(sku=line.sku),
        max_in_flight=cap,
        key=lambda line: line.sku,
    )
    saga.validate()
    return saga


def lines(*skus: str) -> Order:
    return Order(lines=[Line(sku=s, qty=1) for s in skus])


def created(skus: tuple[str, ...], *, cap: int = 2) -> SagaScenario:
    scenario = SagaScenario(order_saga(cap=cap), lines(*skus))
    scenario.expect_command("orders", CreateOrder()).reply(LineReserved(reservation="o"))
    scenario.run_until_idle()
    return scenario


def test_items_are_sent_up_to_the_cap_each_under_its_own_key_and_gathered() -> None:
    scenario = created(("a", "b", "c"))
    out = [m for m in scenario.sent_to("stock")]
    assert [m.envelope.headers[IDEMPOTENCY_KEY_HEADER].split(":", 2)[2] for m in out] == [
        "0:a",
        "1:b",
    ]  # the cap: two out, the third waits
    scenario.expect_command("stock", ReserveLine(sku="b", qty=1)).reply(
        LineReserved(reservation="rb")
    )  # answered out of order
    scenario.run_until_idle()
    assert len(scenario.sent_to("stock")) == 3
    scenario.expect_command("stock", ReserveLine(sku="c", qty=1)).reply(
        LineReserved(reservation="rc")
    )
    scenario.expect_command("stock", ReserveLine(sku="a", qty=1)).reply(
        LineReserved(reservation="ra")
    )
    scenario.run_until_idle()
    assert scenario.status == "completed"
    assert scenario.data == Order(
        lines=lines("a", "b", "c").lines, reserved={"a": "ra", "b": "rb", "c": "rc"}
    )


def test_a_failed_item_stops_the_fan_out_and_only_the_items_that_took_effect_are_undone() -> None:
    scenario = created(("a", "b", "c", "d"))
    scenario.expect_command("stock", ReserveLine(sku="a", qty=1)).reply(
        LineReserved(reservation="ra")
    )  # c is sent now
    scenario.expect_command("stock", ReserveLine(sku="b", qty=1)).fail("out of stock")
    scenario.run_until_idle()
    assert scenario.status == "running"  # c is still out; d is never sent
    scenario.expect_command("stock", ReserveLine(sku="c", qty=1)).reply(
        LineReserved(reservation="rc")
    )
    scenario.run_until_idle()
    assert scenario.status == "compensating"
    for sku in ("c", "a"):  # latest first, one at a time
        scenario.expect_command("stock", ReleaseLine(sku=sku)).reply(LineReserved(reservation=""))
        scenario.run_until_idle()
    scenario.expect_command("orders", CancelOrder()).reply(LineReserved(reservation=""))
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    releases = [m for m in scenario.sent_to("stock") if m.type.endswith("ReleaseLine")]
    assert [m.envelope.headers[COMPENSATES_HEADER].split(":", 2)[2] for m in releases] == [
        "2:c",
        "0:a",
    ]
    assert not any(m.payload.get("sku") == "d" for m in scenario.sent_to("stock"))
    assert scenario.record.last_error == "reserve_lines[1]: out of stock"


def test_a_cancel_inside_a_fan_out_sends_no_more_items_and_undoes_those_that_succeeded() -> None:
    scenario = created(("a", "b", "c"))
    scenario.cancel("customer changed their mind")
    scenario.expect_command("stock", ReserveLine(sku="a", qty=1)).reply(
        LineReserved(reservation="ra")
    )
    scenario.expect_command("stock", ReserveLine(sku="b", qty=1)).reply(
        LineReserved(reservation="rb")
    )
    scenario.run_until_idle()
    assert len([m for m in scenario.sent_to("stock") if m.type.endswith("ReserveLine")]) == 2
    scenario.expect_command("stock", ReleaseLine(sku="b")).reply(LineReserved(reservation=""))
    scenario.expect_command("stock", ReleaseLine(sku="a")).reply(LineReserved(reservation=""))
    scenario.expect_command("orders", CancelOrder()).reply(LineReserved(reservation=""))
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert scenario.record.last_error == "customer changed their mind"


def test_a_resume_inside_a_fan_out_sends_the_items_still_out_again_under_their_ids() -> None:
    scenario = created(("a", "b", "c"))
    first = {m.envelope.message_id for m in scenario.sent_to("stock")}
    assert scenario.resume()
    again = [m.envelope.message_id for m in scenario.sent_to("stock")][2:]
    assert set(again) == first


def test_a_resume_while_an_item_compensation_is_stuck_sends_that_one_again() -> None:
    scenario = created(("a", "b"))
    scenario.expect_command("stock", ReserveLine(sku="a", qty=1)).reply(
        LineReserved(reservation="ra")
    )
    scenario.expect_command("stock", ReserveLine(sku="b", qty=1)).fail("no")
    scenario.run_until_idle()
    undo = scenario.expect_command("stock", ReleaseLine(sku="a"))
    assert scenario.resume()
    assert scenario.sent_to("stock")[-1].envelope.message_id == undo.message.envelope.message_id


def test_a_later_failure_undoes_every_item_of_a_completed_fan_out() -> None:
    saga = order_saga()
    saga.remote("charge", service="payments", command=CreateOrder)
    scenario = SagaScenario(saga, lines("a", "b"))
    scenario.on("orders", CreateOrder, LineReserved(reservation="o"))
    scenario.on("orders", CancelOrder, LineReserved(reservation=""))
    scenario.on("stock", ReserveLine, LineReserved(reservation="r"))
    scenario.on("stock", ReleaseLine, LineReserved(reservation=""))
    scenario.expect_command("payments", CreateOrder()).fail("declined")
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    releases = [m.payload["sku"] for m in scenario.sent_to("stock") if "sku" in m.payload
                and m.type.endswith("ReleaseLine")]  # fmt: skip
    assert releases == ["b", "a"]


def test_items_that_are_not_a_list_fail_the_saga_saying_so() -> None:
    def not_a_list(data: Order) -> Any:  # what untyped code may well do
        return len(data.lines)

    saga = Saga("order", data=Order)
    saga.remote("create", service="orders", command=CreateOrder, compensate=CancelOrder)
    saga.for_each("reserve_lines", items=not_a_list, service="stock",
                  command=lambda d, line: ReserveLine(sku="x", qty=1))  # fmt: skip
    scenario = SagaScenario(saga, lines("a"))
    scenario.expect_command("orders", CreateOrder()).reply(LineReserved(reservation="o"))
    scenario.expect_command("orders", CancelOrder()).reply(LineReserved(reservation=""))
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert scenario.record.last_error == "fan-out 'reserve_lines': items= must give a list, got int"


def test_an_empty_list_goes_straight_on() -> None:
    scenario = created(())
    assert scenario.status == "completed"


def test_a_reducer_that_changes_the_items_is_refused() -> None:
    saga = Saga("order", data=Order)
    saga.for_each(
        "reserve_lines",
        items=lambda d: d.lines,
        service="stock",
        command=lambda d, line: ReserveLine(sku=line.sku, qty=line.qty),
        reply=LineReserved,
        on_reply=lambda d, line, r: d.model_copy(update={"lines": d.lines[1:]}),
    )
    scenario = SagaScenario(saga, lines("a", "b"))
    with pytest.raises(ConfigurationError, match="its items changed while it ran"):
        scenario.expect_command("stock", ReserveLine(sku="a", qty=1)).reply(
            LineReserved(reservation="ra")
        )
        scenario.run_until_idle()


@pytest.mark.parametrize(
    ("declare", "problem"),
    [
        (dict(max_in_flight=0), "max_in_flight must be a whole number >= 1, not 0"),
        (dict(on_reply=lambda d, i, r: d), "on_reply= needs reply="),
        (dict(service="no such service!"), "fan-out 'fan': service: "),
    ],
)
def test_registration_mistakes_are_named(declare: dict[str, object], problem: str) -> None:
    saga = Saga("order", data=Order)
    options: dict[str, object] = {
        "items": lambda d: d.lines,
        "service": "stock",
        "command": lambda d, line: ReserveLine(sku=line.sku, qty=1),
        **declare,
    }
    saga.for_each("fan", **options)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=problem.replace("(", r"\(").replace("[", r"\[")):
        saga.validate()


def test_a_fan_out_after_the_pivot_is_refused() -> None:
    saga = Saga("order", data=Order)
    saga.remote("create", service="orders", command=CreateOrder, pivot=True)
    saga.for_each("fan", items=lambda d: d.lines, service="stock",
                  command=lambda d, line: ReserveLine(sku=line.sku, qty=1))  # fmt: skip
    with pytest.raises(ConfigurationError, match="'fan' comes after the pivot 'create'"):
        saga.validate()


def test_the_fingerprint_includes_the_fan_out_shape() -> None:
    keyed = order_saga()
    unkeyed = Saga("order", data=Order)
    unkeyed.remote("create", service="orders", command=CreateOrder, compensate=CancelOrder)
    unkeyed.for_each(
        "reserve_lines",
        items=lambda d: d.lines,
        service="stock",
        command=lambda d, line: ReserveLine(sku=line.sku, qty=line.qty),
        reply=LineReserved,
        compensate=lambda d, line: ReleaseLine(sku=line.sku),
    )
    assert shape(keyed)[1]["kind"] == "for_each"
    assert fingerprint(shape(keyed)) != fingerprint(shape(unkeyed))  # the key= identity


def test_a_thousand_items_keep_a_compact_step_state() -> None:
    """One character per item and the messages out: under 4 KB of JSON with 50 out, next
    to the 64 KB data cap (the items themselves are in the data, and counted there)."""
    scenario = created(tuple(f"sku-{n:04d}" for n in range(1000)), cap=50)
    state = scenario.record.step_state
    assert len(state["awaits"]) == 50 and len(state["marks"]) == 1000
    assert len(json.dumps(state)) < 4096, len(json.dumps(state))
