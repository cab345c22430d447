"""Replies that come in groups: the commands a step sends together and awaits all of (a
parallel group's members, a fan-out's first items) say how many replies they join, and the
consumer of the saga's home is told to wait for more only while siblings of a reply are
still to come."""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from typing import Any
from uuid import UUID, uuid4

import pytest
from pydantic import BaseModel

from saga import Saga, Tx
from saga.cli.consume import consume
from saga.consumers.worker import ConsumerOptions
from saga.engine import reply_joins
from saga.engine.reply_joins import ReplyJoins
from saga.messaging.envelope import JOINS_HEADER, STEP_HEADER, Envelope
from saga.testing import SagaScenario
from tests.support.group_order import Order, Reserve, Reserved, order_saga
from tests.support.order_lines import CreateOrder, ReleaseLine, lines
from tests.support.order_lines import Order as Lines

SAGA_ID = UUID(int=7)


def reply(step: str, joined: str | None, saga_id: UUID = SAGA_ID) -> Envelope:
    headers = {STEP_HEADER: step, **({JOINS_HEADER: joined} if joined else {})}
    return Envelope.wrap(Reserved(reference="r"), saga_id=saga_id, headers=headers)


def joins_sent_to(scenario: SagaScenario, service: str) -> list[str | None]:
    """The ``joins`` header of each message sent to ``service`` so far (None: none)."""
    return [m.envelope.headers.get(JOINS_HEADER) for m in scenario.sent_to(service)]


def at_the_group(
    saga: Saga[Any], data: BaseModel | None = None, local_steps: dict[str, None] | None = None
) -> SagaScenario:
    """A run of ``saga`` (``order_saga``'s shape) that has sent its group's commands."""
    scenario = SagaScenario(saga, data or Order(), local_steps=local_steps or {})
    scenario.expect_command("orders").reply(Reserved())
    scenario.run_until_idle()
    return scenario


def test_the_commands_a_group_sends_together_say_how_many_replies_they_join() -> None:
    scenario = at_the_group(order_saga())
    assert joins_sent_to(scenario, "inventory") == joins_sent_to(scenario, "customers") == ["2"]
    scenario.expect_command("inventory").reply(Reserved(reference="s"))
    scenario.expect_command("customers").reply(Reserved(reference="c"))
    scenario.run_until_idle()
    # the steps awaited alone: the one before the group and the one after it
    assert joins_sent_to(scenario, "orders") == joins_sent_to(scenario, "payments") == [None]


def test_a_compensation_is_awaited_alone() -> None:
    scenario = at_the_group(order_saga())
    scenario.expect_command("inventory").reply(Reserved(reference="s"))
    scenario.expect_command("customers").fail("no credit")
    scenario.run_until_idle()
    assert joins_sent_to(scenario, "inventory") == ["2", None]  # the release


def conditional_group(credit_too: bool) -> Saga[Order]:
    saga = Saga("conditional", data=Order)
    saga.remote("create", service="orders", command=lambda d: Reserve(what="order"))
    with saga.parallel("reserve"):
        for name in ("a", "b"):
            saga.remote(name, service=name, command=lambda d: Reserve(what="x"), reply=Reserved)
        saga.remote("c", service="c", command=lambda d: Reserve(what="c"), reply=Reserved,
                    when=lambda d: credit_too)  # fmt: skip
    return saga


@pytest.mark.parametrize(("credit_too", "joined"), [(True, "3"), (False, "2")])
def test_a_member_counts_only_when_it_starts(credit_too: bool, joined: str) -> None:
    scenario = at_the_group(conditional_group(credit_too))
    assert joins_sent_to(scenario, "a") == joins_sent_to(scenario, "b") == [joined]
    assert joins_sent_to(scenario, "c") == ([joined] if credit_too else [])


def record_it(tx: Tx, d: Order) -> None:
    pass


def test_a_group_with_one_remote_member_joins_nothing() -> None:
    saga = Saga("one_remote", data=Order)
    saga.remote("create", service="orders", command=lambda d: Reserve(what="order"))
    with saga.parallel("reserve"):
        saga.remote("a", service="s", command=lambda d: Reserve(what="x"), reply=Reserved)
        saga.local("b")(record_it)
    assert not ReplyJoins([saga])
    assert joins_sent_to(at_the_group(saga, local_steps={"record_it": None}), "s") == [None]


def lines_saga(*, grouped: bool, cap: int) -> Saga[Lines]:
    """Reserve every line (with the credit beside them in a group when ``grouped``)."""
    saga = Saga("lines", data=Lines)
    saga.remote("create", service="orders", command=CreateOrder)
    with saga.parallel("reserve") if grouped else nullcontext():
        saga.for_each("reserve_lines", items=lambda d: d.lines, service="stock",
                      command=lambda d, line: ReleaseLine(sku=line.sku), reply=Reserved,
                      max_in_flight=cap, key=lambda line: line.sku)  # fmt: skip
        if grouped:
            saga.remote("reserve_credit", service="customers", command=CreateOrder, reply=Reserved)
    return saga


def test_a_fan_out_s_first_items_join_its_group_s_other_members() -> None:
    scenario = at_the_group(lines_saga(grouped=True, cap=2), lines("a", "b", "c"))
    assert joins_sent_to(scenario, "stock") == ["3", "3"]  # two items out, the third waits
    assert joins_sent_to(scenario, "customers") == ["3"]
    scenario.expect_command("stock").reply(Reserved(reference="a"))
    scenario.run_until_idle()
    assert joins_sent_to(scenario, "stock") == ["3", "3", None]  # sent later: awaited alone


@pytest.mark.parametrize(("skus", "joined"), [(("a", "b", "c"), ["3", "3", "3"]), (("a",), [None])])
def test_a_fan_out_s_first_items_join_each_other(
    skus: tuple[str, ...], joined: list[str | None]
) -> None:
    scenario = at_the_group(lines_saga(grouped=False, cap=5), lines(*skus))
    assert joins_sent_to(scenario, "stock") == joined
    assert ReplyJoins([lines_saga(grouped=False, cap=5)]).types == {"Reserved"}


def test_only_the_members_reply_types_are_looked_at() -> None:
    assert ReplyJoins([order_saga()]).types == {"Reserved"}


def test_items_of_one_fan_out_count_apart() -> None:
    joins = ReplyJoins([order_saga()])
    first, second = (Envelope.wrap(Reserved(), saga_id=SAGA_ID, causation_id=uuid4(),
                                   headers={STEP_HEADER: "lines", JOINS_HEADER: "2"})
                     for _ in range(2))  # fmt: skip
    assert joins.more_to_come(first)
    assert joins.more_to_come(first)  # the same item's reply again
    assert not joins.more_to_come(second)


def test_more_is_to_come_until_every_member_of_the_saga_answered() -> None:
    joins = ReplyJoins([order_saga()])
    assert joins.more_to_come(reply("reserve_stock", "2"))
    assert joins.more_to_come(reply("reserve_stock", "2"))  # a duplicate counts once
    other = UUID(int=8)
    assert joins.more_to_come(reply("reserve_credit", "2", saga_id=other))  # another saga's
    assert not joins.more_to_come(reply("reserve_credit", "2"))  # the last of the group
    assert not joins.more_to_come(reply("reserve_stock", "2", saga_id=other))


def test_a_reply_without_the_header_never_waits() -> None:
    joins = ReplyJoins([order_saga()])
    assert not joins.more_to_come(reply("reserve_stock", None))
    assert not joins.more_to_come(reply("reserve_stock", "two"))


def test_the_oldest_sagas_are_forgotten_past_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reply_joins, "REMEMBERED", 2)
    joins = ReplyJoins([order_saga()])
    for n in (1, 2, 3):
        assert joins.more_to_come(reply("reserve_stock", "2", saga_id=UUID(int=n)))
    # saga 1 is forgotten: its last reply looks like a first one; saga 3's is known
    assert joins.more_to_come(reply("reserve_credit", "2", saga_id=UUID(int=1)))
    assert not joins.more_to_come(reply("reserve_credit", "2", saga_id=UUID(int=3)))


def test_the_linger_is_checked_and_the_command_line_default_is_the_options() -> None:
    with pytest.raises(ValueError, match="reply_linger must be 0 or more seconds, not -1"):
        ConsumerOptions(reply_linger=-1)
    default_ms = inspect.signature(consume).parameters["reply_linger_ms"].default
    assert ConsumerOptions().reply_linger == default_ms / 1000
