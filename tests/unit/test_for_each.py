"""A fan-out, event by event: one command per item under its own key, at most the cap out
at once, results gathered by the reducer, only the items that took effect undone, and
mistakes refused at registration or reported when the saga reaches the step."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from saga import Saga, StepRetry
from saga.engine.fingerprints import fingerprint, shape
from saga.errors import ConfigurationError
from saga.messaging.envelope import COMPENSATES_HEADER, IDEMPOTENCY_KEY_HEADER
from saga.testing import SagaScenario
from saga.testing.messages import Message
from tests.support.order_lines import CancelOrder, CreateOrder, Order, ReleaseLine, lines


class ReserveLine(BaseModel):
    sku: str
    qty: int


class LineReserved(BaseModel):
    reservation: str


def order_saga(*, cap: int = 2, retry: StepRetry | None = None, keyed: bool = True) -> Saga[Order]:
    """Create the order, then reserve its lines; ``keyed``: each line's key is its sku."""
    saga = Saga("order", data=Order, retry=retry or StepRetry())
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
        key=(lambda line: line.sku) if keyed else None,
    )
    saga.validate()
    return saga


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


def releases(scenario: SagaScenario) -> list[Message]:
    return [m for m in scenario.sent_to("stock") if m.type.endswith("ReleaseLine")]


def released_sku(message: Message) -> str:
    return str(message.payload["sku"])


def charge_declined(
    skus: tuple[str, ...], *, cap: int = 2, retry: StepRetry | None = None
) -> SagaScenario:
    """Every item reserved, then a later step fails; the scenario is not run on from there."""
    saga = order_saga(cap=cap, retry=retry)
    saga.remote("charge", service="payments", command=CreateOrder)
    scenario = SagaScenario(saga, lines(*skus))
    scenario.on("orders", CreateOrder, LineReserved(reservation="o"))
    scenario.on("orders", CancelOrder, LineReserved(reservation=""))
    scenario.on("stock", ReserveLine, LineReserved(reservation="r"))
    scenario.expect_command("payments", CreateOrder()).fail("declined")
    return scenario


def compensating(
    skus: tuple[str, ...], *, cap: int, retry: StepRetry | None = None
) -> SagaScenario:
    """Every item reserved, then a later step fails: every item is to be undone."""
    scenario = charge_declined(skus, cap=cap, retry=retry)
    scenario.run_until_idle()
    assert scenario.status == "compensating"
    return scenario


def test_compensations_go_out_up_to_the_cap_and_each_answer_in_any_order_sends_the_next() -> None:
    scenario = compensating(("a", "b", "c", "d", "e"), cap=2)
    assert [released_sku(m) for m in releases(scenario)] == ["e", "d"]  # latest first, 2 out
    assert scenario.record.completed_steps == ["create", "reserve_lines"]
    scenario.expect_command("stock", ReleaseLine(sku="d")).reply(LineReserved(reservation=""))
    scenario.run_until_idle()
    assert [released_sku(m) for m in releases(scenario)] == ["e", "d", "c"]
    for sku in ("c", "e", "b"):  # answered in another order than sent
        scenario.expect_command("stock", ReleaseLine(sku=sku)).reply(LineReserved(reservation=""))
        scenario.run_until_idle()
        assert len(scenario.record.step_state["awaits"]) <= 2
    assert scenario.sent_to("orders")[-1].type.endswith("CreateOrder")  # "a" is still out
    scenario.expect_command("stock", ReleaseLine(sku="a")).reply(LineReserved(reservation=""))
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert sorted(released_sku(m) for m in releases(scenario)) == ["a", "b", "c", "d", "e"]
    assert scenario.steps.count("reserve_lines compensation succeeded") == 5


def test_a_late_duplicate_answer_to_a_compensation_is_refused() -> None:
    scenario = compensating(("a", "b", "c"), cap=2)
    undo_c = scenario.expect_command("stock", ReleaseLine(sku="c")).message
    scenario.answer(undo_c, LineReserved(reservation=""))
    scenario.run_until_idle()
    state = dict(scenario.record.step_state)
    scenario.answer(undo_c, LineReserved(reservation=""))  # the participant answers again
    scenario.run_until_idle()
    assert scenario.ignored[-1].causation_id == undo_c.envelope.message_id
    assert scenario.record.step_state == state
    assert [released_sku(m) for m in releases(scenario)] == ["c", "b", "a"]


def test_a_resume_while_compensating_sends_every_compensation_still_out_again() -> None:
    scenario = compensating(("a", "b", "c"), cap=2)
    scenario.expect_command("stock", ReleaseLine(sku="c")).reply(LineReserved(reservation=""))
    scenario.run_until_idle()
    out = {m.envelope.message_id for m in releases(scenario)[1:]}  # b and a
    assert scenario.resume()
    again = releases(scenario)[3:]
    assert {m.envelope.message_id for m in again} == out
    assert sorted(released_sku(m) for m in again) == ["a", "b"]


def test_a_failed_item_compensation_retries_on_its_own_while_the_others_go_on() -> None:
    scenario = compensating(("a", "b", "c"), cap=2, retry=StepRetry(attempts=3))
    scenario.expect_command("stock", ReleaseLine(sku="c")).fail("stock service busy")
    scenario.expect_command("stock", ReleaseLine(sku="b")).reply(LineReserved(reservation=""))
    scenario.run_until_idle()
    assert [released_sku(m) for m in releases(scenario)] == ["c", "b", "a"]  # a took b's place
    scenario.expect_command("stock", ReleaseLine(sku="a")).reply(LineReserved(reservation=""))
    scenario.advance(timedelta(seconds=1))  # c's retry timer
    again = scenario.expect_command("stock", ReleaseLine(sku="c"))
    first = releases(scenario)[0]
    assert again.message.envelope.message_id != first.envelope.message_id
    assert (
        again.message.envelope.headers[IDEMPOTENCY_KEY_HEADER]
        == (first.envelope.headers[IDEMPOTENCY_KEY_HEADER])
    )
    again.reply(LineReserved(reservation=""))
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    assert "reserve_lines compensation failed" in scenario.steps


def test_giving_up_on_an_item_compensation_leaves_the_rest_to_a_resume() -> None:
    scenario = compensating(("a", "b", "c"), cap=2, retry=StepRetry(attempts=1))
    scenario.expect_command("stock", ReleaseLine(sku="c")).fail("no such reservation")
    scenario.run_until_idle()
    assert scenario.status == "compensation_failed"
    assert scenario.record.last_error == "reserve_lines[2]: no such reservation"
    undo_b = scenario.expect_command("stock", ReleaseLine(sku="b")).message
    scenario.answer(undo_b, LineReserved(reservation=""))
    scenario.run_until_idle()
    assert scenario.ignored[-1].causation_id == undo_b.envelope.message_id  # not awaited
    assert scenario.resume()
    scenario.on("stock", ReleaseLine, LineReserved(reservation=""))
    scenario.run_until_idle()
    assert scenario.status == "compensated"
    resent = [released_sku(m) for m in releases(scenario)[2:]]
    assert sorted(resent) == ["a", "b", "c"]  # b again (its key makes it a no-op), c, a


def test_a_later_failure_undoes_every_item_of_a_completed_fan_out() -> None:
    scenario = charge_declined(("a", "b"))
    scenario.on("stock", ReleaseLine, LineReserved(reservation=""))
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
    unkeyed = order_saga(keyed=False)
    assert shape(keyed)[1]["kind"] == "for_each"
    assert fingerprint(shape(keyed)) != fingerprint(shape(unkeyed))  # the key= identity


def test_a_thousand_items_keep_a_compact_step_state() -> None:
    """One character per item and the messages out: under 4 KB of JSON with 50 out, next
    to the 64 KB data cap (the items themselves are in the data, and counted there)."""
    scenario = created(tuple(f"sku-{n:04d}" for n in range(1000)), cap=50)
    state = scenario.record.step_state
    assert len(state["awaits"]) == 50 and len(state["marks"]) == 1000
    assert len(json.dumps(state)) < 4096, len(json.dumps(state))


def test_a_thousand_items_compensating_keep_a_compact_step_state() -> None:
    """Compensating, the marks and the 50 compensations out, each with its item's position
    and attempt: still under 4 KB of JSON."""
    scenario = compensating(tuple(f"sku-{n:04d}" for n in range(1000)), cap=50)
    state = scenario.record.step_state
    assert len(state["awaits"]) == 50 and state["marks"].count("<") == 50
    assert len(json.dumps(state)) < 4096, len(json.dumps(state))
