"""Replies that come in groups: a parallel group's remote members say in their commands how
many replies the group joins, and the consumer of the saga's home is told to wait for more
only while siblings of a reply are still to come."""

from __future__ import annotations

import inspect
from uuid import UUID, uuid4

import pytest

from saga import Saga
from saga.cli.consume import consume
from saga.consumers.worker import ConsumerOptions
from saga.engine import reply_joins
from saga.engine.reply_joins import ReplyJoins
from saga.engine.step_envelopes import StepEnvelopes
from saga.engine.steps import ParallelGroup, RemoteStep
from saga.messaging.envelope import JOINS_HEADER, STEP_HEADER, Envelope
from tests.support.group_order import Order, Reserve, Reserved, order_saga

SAGA_ID = UUID(int=7)


def envelopes(saga: Saga[Order]) -> StepEnvelopes:
    return StepEnvelopes(saga, SAGA_ID, None, "home", uuid4)


def remote(saga: Saga[Order], name: str) -> RemoteStep:
    parts = [part for step in saga.steps for part in step.parts()]
    found = next(part for part in parts if part.name == name)
    assert isinstance(found, RemoteStep)
    return found


def reply(step: str, joined: str | None, saga_id: UUID = SAGA_ID) -> Envelope:
    headers = {STEP_HEADER: step, **({JOINS_HEADER: joined} if joined else {})}
    return Envelope.wrap(Reserved(reference="r"), saga_id=saga_id, headers=headers)


def test_a_member_s_command_says_how_many_replies_its_group_joins_and_no_other_does() -> None:
    saga = order_saga()
    made = envelopes(saga)
    data = Order()
    for member in ("reserve_stock", "reserve_credit"):
        assert made.command(remote(saga, member), data, None).headers[JOINS_HEADER] == "2"
        # its compensation is awaited alone
        assert JOINS_HEADER not in made.compensation(remote(saga, member), data).headers
    for alone in ("create", "charge"):
        assert JOINS_HEADER not in made.command(remote(saga, alone), data, None).headers


def test_a_member_that_may_not_start_is_not_counted() -> None:
    saga = Saga("conditional", data=Order)
    with saga.parallel("reserve"):
        for name in ("a", "b"):
            saga.remote(name, service="s", command=lambda d: Reserve(what="x"), reply=Reserved)
        saga.remote("c", service="s", command=lambda d: Reserve(what="c"), reply=Reserved,
                    when=lambda d: d.stock is None)  # fmt: skip
    (group,) = saga.steps
    assert isinstance(group, ParallelGroup)
    assert [m.name for m in group.joined_replies()] == ["a", "b"]
    assert saga.joined_replies("a") == 2 and saga.joined_replies("c") == 0


def test_a_group_with_one_remote_member_joins_nothing() -> None:
    saga = Saga("one_remote", data=Order)
    with saga.parallel("reserve"):
        saga.remote("a", service="s", command=lambda d: Reserve(what="x"), reply=Reserved)
        saga.local("b")(lambda tx, d: None)
    assert not ReplyJoins([saga])
    assert JOINS_HEADER not in envelopes(saga).command(remote(saga, "a"), Order(), None).headers


def test_only_the_members_reply_types_are_looked_at() -> None:
    assert ReplyJoins([order_saga()]).types == {"Reserved"}


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
