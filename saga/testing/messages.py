"""What the harness saw travel, and comparing it with what a test expected, payload and all."""

from __future__ import annotations

import builtins
import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from saga.errors import PayloadMismatch
from saga.messaging.envelope import Envelope, message_type_of

M = TypeVar("M", bound=BaseModel)

#: What a test may expect: a whole message (type and payload compared) or a type alone.
Expected = BaseModel | type[BaseModel]


@dataclass(frozen=True, slots=True)
class Message:
    """One message as it left an outbox: where it went (None: an event, published to its
    subscribers) and its envelope."""

    destination: str | None
    envelope: Envelope
    body: bytes

    @property
    def type(self) -> str:
        return self.envelope.type

    @property
    def service(self) -> str:
        """The service a command was sent to (an event has subscribers instead)."""
        if self.destination is None:
            raise AssertionError(f"{self!r} is an event: it has subscribers, not a destination")
        return self.destination

    @property
    def payload(self) -> dict[str, Any]:
        return self.envelope.payload

    def as_model(self, model: builtins.type[M]) -> M:
        """The payload read as ``model``."""
        return model.model_validate(self.envelope.payload)

    def __repr__(self) -> str:
        to = f"to {self.destination}" if self.destination else "published"
        return f"<{self.type} {to}: {json.dumps(self.payload, sort_keys=True)}>"


class SentMessages(list[Message]):
    """Every message sent, in order; called as ``sent(service, Type, where=...)``, the
    ``Type`` messages sent to ``service`` that ``where`` accepts, read as ``Type``."""

    def __call__(
        self,
        service: str,
        message_type: builtins.type[M],
        where: Callable[[M], bool] | None = None,
    ) -> list[M]:
        """The matches, oldest first; :class:`PayloadMismatch` listing what was sent
        to ``service`` when none matches."""
        to_service = [m for m in self if m.destination == service]
        wanted = message_type_of(message_type)
        of_type = [m.as_model(message_type) for m in to_service if m.type == wanted]
        matching = [m for m in of_type if where is None or where(m)]
        if matching:
            return matching
        condition = f" that {_describe(where)} accepts" if where is not None else ""
        listing = "\n".join(f"  {m!r}" for m in to_service) or "  (nothing)"
        raise PayloadMismatch(
            f"no {wanted} sent to {service}{condition}; sent to {service}:\n{listing}"
        )


def check_message(expected: Expected, actual: Message, what: str) -> None:
    """Raise :class:`PayloadMismatch` unless ``actual`` is ``expected`` (type, and payload
    when ``expected`` is a message rather than a class)."""
    if isinstance(expected, type):
        if message_type_of(expected) != actual.type:
            raise PayloadMismatch(f"{what}: expected a {message_type_of(expected)}, got {actual!r}")
        return
    want, got = _fields(expected), _payload_fields(actual)
    if want != got:
        raise PayloadMismatch(f"{what} differs:\n{side_by_side(want, got)}")


def matches(expected: Expected, actual: Message) -> bool:
    if isinstance(expected, type):
        return message_type_of(expected) == actual.type
    return _fields(expected) == _payload_fields(actual)


def check_messages(expected: Sequence[Expected], actual: Sequence[Message], what: str) -> None:
    """Each of ``actual`` is the ``expected`` at its place, and there are as many."""
    for index, (want, got) in enumerate(zip(expected, actual, strict=False)):
        check_message(want, got, f"{what} #{index + 1}")
    if len(expected) != len(actual):
        listing = "\n".join(f"  {m!r}" for m in actual) or "  (none)"
        raise PayloadMismatch(
            f"{what}: expected {len(expected)} message(s), got {len(actual)}:\n{listing}"
        )


def check_messages_in_any_order(
    expected: Sequence[Expected], actual: Sequence[Message], what: str
) -> None:
    """Each of ``expected`` matches one of ``actual``, each of those matched once, and
    nothing else is there; the order does not matter."""
    left = list(actual)
    missing: list[Expected] = []
    # whole messages first: a type alone takes whatever of its kind they leave
    for want in sorted(expected, key=lambda e: isinstance(e, type)):
        found = next((got for got in left if matches(want, got)), None)
        if found is None:
            missing.append(want)
        else:
            left.remove(found)
    if not missing and not left:
        return
    lines = [f"{what}, in any order, differ:"]
    for want in missing:
        lines.append(f"  expected, not sent: {_show_expected(want)}")
        if not isinstance(want, type):
            kin = [m for m in left if m.type == message_type_of(type(want))]
            if kin:  # the nearest of its kind, field by field
                lines.append(side_by_side(_fields(want), _payload_fields(kin[0])))
    lines.extend(f"  sent, not expected: {got!r}" for got in left)
    raise PayloadMismatch("\n".join(lines))


def side_by_side(expected: dict[str, Any], actual: dict[str, Any]) -> str:
    """A table of every field: expected, actual, and a mark where they differ."""
    rows = [("field", "expected", "actual", "")]
    for key in [*expected, *(k for k in actual if k not in expected)]:
        want = _show(expected, key)
        got = _show(actual, key)
        rows.append((key, want, got, "" if want == got else "<-- differs"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        (
            "  "
            + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3]))
            + "  "
            + row[3]
        ).rstrip()
        for row in rows
    )


def _show(values: dict[str, Any], key: str) -> str:
    return json.dumps(values[key], sort_keys=True) if key in values else "(missing)"


def _fields(expected: BaseModel) -> dict[str, Any]:
    return {"type": message_type_of(type(expected)), **expected.model_dump(mode="json")}


def _payload_fields(actual: Message) -> dict[str, Any]:
    return {"type": actual.type, **actual.payload}


def _show_expected(expected: Expected) -> str:
    if isinstance(expected, type):
        return f"a {message_type_of(expected)}"
    payload = json.dumps(expected.model_dump(mode="json"), sort_keys=True)
    return f"<{message_type_of(type(expected))}: {payload}>"


def _describe(where: Callable[..., bool]) -> str:
    """A lambda's source, when Python finds it; a function's name otherwise."""
    name: str = getattr(where, "__qualname__", repr(where))
    try:
        source = inspect.getsource(where).strip()
    except (OSError, TypeError):
        return name
    if "<lambda>" not in name or "lambda" not in source:
        return name
    source = source[source.index("lambda") :].rstrip(",")
    while source.endswith(")") and source.count(")") > source.count("("):
        source = source[:-1]  # the call the lambda was written in
    return source
