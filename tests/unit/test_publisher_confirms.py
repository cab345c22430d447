"""Which messages a run of RabbitMQ's confirms settles: one tag, or every tag up to one
(``multiple``), acked or nacked. The broker side runs for real in
tests/integration/test_relay.py and test_amqp_transport.py; here only the bookkeeping."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from saga.broker.amqp.confirms import PublisherConfirms


class _Channel:
    """What PublisherConfirms needs of a py-amqp channel: confirm mode and its events."""

    def __init__(self) -> None:
        self.events: defaultdict[str, set[Callable[..., Any]]] = defaultdict(set)
        self.confirming = False

    def confirm_select(self) -> None:
        self.confirming = True

    def answer(self, method: str, tag: int, multiple: bool = False) -> None:
        for callback in self.events[method]:
            callback(tag, multiple)


class _Connection:
    """Delivers the broker's answers, queued by the test, as ``drain_events`` would."""

    def __init__(self, channel: _Channel, answers: list[tuple[str, int, bool]]) -> None:
        self.channel = channel
        self.answers = answers

    def drain_events(self, timeout: float) -> None:
        assert self.answers, "waiting on, with every answer of the broker taken"
        self.channel.answer(*self.answers.pop(0))

    def heartbeat_check(self) -> None:
        pass


def test_acks_and_nacks_one_by_one_and_up_to_a_tag() -> None:
    channel = _Channel()
    confirms = PublisherConfirms(channel)
    assert channel.confirming
    for message_id in "abcdef":
        confirms.published(message_id)  # tags 1 to 6
    answers = [
        ("basic_ack", 2, True),  # a, b
        ("basic_nack", 3, False),  # c
        ("basic_ack", 4, False),  # d
        ("basic_nack", 6, True),  # e, f
    ]
    assert confirms.wait(_Connection(channel, answers)) == {"c", "e", "f"}
    assert answers == []
    confirms.published("g")  # tag 7: the numbering goes on across batches
    assert confirms.wait(_Connection(channel, [("basic_ack", 7, False)])) == set()
