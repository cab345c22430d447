"""Participants a test leaves out: their commands wait for the test's answer, or a rule's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from saga.messaging.control import Ack, FailureReply
from saga.messaging.envelope import message_type_of
from saga.testing.messages import Expected, Message, matches


@dataclass(frozen=True, slots=True)
class Fail:
    """A rule's answer: the participant refuses the command (``StepFailed`` there)."""

    reason: str
    code: str | None = None


#: What a rule answers: a reply, a :class:`Fail`, or a function of the command giving either.
Answer = BaseModel | Fail | Callable[[Message], "BaseModel | Fail"]


class Answers(Protocol):
    """What answers a stubbed participant's command: a harness, or a scenario."""

    def answer(self, command: Message, answer: BaseModel | Fail) -> None: ...


class PendingCommand:
    """A command sent to a stubbed participant, waiting for the test to answer it."""

    def __init__(self, harness: Answers, message: Message) -> None:
        self.harness = harness
        self.message = message

    def __repr__(self) -> str:
        return f"PendingCommand({self.message!r})"

    def reply(self, reply: BaseModel | None = None) -> None:
        """Answer with ``reply`` (the participant's success; ``Ack``, as a handler that
        returns nothing answers, when None); delivered by the next run."""
        self.harness.answer(self.message, Ack() if reply is None else reply)

    def fail(self, reason: str, code: str | None = None) -> None:
        """Answer with a business failure, as ``raise StepFailed(reason, code=code)`` would."""
        self.harness.answer(self.message, Fail(reason, code))


class Stubs:
    """Rules per (service, message type), and the commands still waiting for an answer."""

    def __init__(self) -> None:
        self._rules: dict[tuple[str, str], Answer] = {}
        self.waiting: dict[str, list[Message]] = {}

    def add_rule(self, service: str, type_name: str, answer: Answer) -> None:
        self._rules[(service, type_name)] = answer

    def copy(self) -> Stubs:
        """The same rules, no command waiting."""
        copied = Stubs()
        copied._rules = dict(self._rules)
        return copied

    def receive(self, message: Message) -> BaseModel | Fail | None:
        """The rule's answer to ``message``, or None: it waits for the test."""
        rule = self._rules.get((message.service, message.type))
        if rule is None:
            self.waiting.setdefault(message.service, []).append(message)
            return None
        return rule(message) if callable(rule) else rule

    def take_all(self, service: str, command: type[BaseModel]) -> list[Message]:
        """Every ``command`` waiting at ``service``, oldest first, taken from the queue."""
        wanted = message_type_of(command)
        queue = self.waiting.get(service, [])
        taken = [m for m in queue if m.type == wanted]
        queue[:] = [m for m in queue if m.type != wanted]
        return taken

    def take(self, service: str, expected: Expected | None) -> Message:
        """The oldest command waiting at ``service`` (of ``expected``'s type, when given);
        when ``expected`` is a whole message, the oldest equal to it if one is (commands sent
        at once, such as a fan-out's, are expected in any order)."""
        queue = self.waiting.get(service, [])
        if not isinstance(expected, type | None):
            for index, message in enumerate(queue):
                if matches(expected, message):
                    return queue.pop(index)
        wanted = None
        if expected is not None:
            wanted = message_type_of(expected if isinstance(expected, type) else type(expected))
        for index, message in enumerate(queue):
            if wanted is None or message.type == wanted:
                return queue.pop(index)
        waiting = {s: [m.type for m in q] for s, q in self.waiting.items() if q}
        raise AssertionError(
            f"no {wanted or 'command'} waits for an answer from {service!r} "
            f"(waiting: {waiting or 'nothing'})"
        )


def as_reply(answer: BaseModel | Fail, command: Message) -> BaseModel:
    """The message a participant sends back for ``answer``."""
    if isinstance(answer, Fail):
        return FailureReply(reason=answer.reason, code=answer.code, failed_type=command.type)
    return answer
