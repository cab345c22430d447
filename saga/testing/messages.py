"""What the harness saw travel, and comparing it with what a test expected, payload and all."""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
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


def check_message(expected: Expected, actual: Message, what: str) -> None:
    """Raise :class:`PayloadMismatch` unless ``actual`` is ``expected`` (type, and payload
    when ``expected`` is a message rather than a class)."""
    if isinstance(expected, type):
        if message_type_of(expected) != actual.type:
            raise PayloadMismatch(f"{what}: expected a {message_type_of(expected)}, got {actual!r}")
        return
    want = {"type": message_type_of(type(expected)), **expected.model_dump(mode="json")}
    got = {"type": actual.type, **actual.payload}
    if want != got:
        raise PayloadMismatch(f"{what} differs:\n{side_by_side(want, got)}")


def check_messages(expected: Sequence[Expected], actual: Sequence[Message], what: str) -> None:
    """Each of ``actual`` is the ``expected`` at its place, and there are as many."""
    for index, (want, got) in enumerate(zip(expected, actual, strict=False)):
        check_message(want, got, f"{what} #{index + 1}")
    if len(expected) != len(actual):
        listing = "\n".join(f"  {m!r}" for m in actual) or "  (none)"
        raise PayloadMismatch(
            f"{what}: expected {len(expected)} message(s), got {len(actual)}:\n{listing}"
        )


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
