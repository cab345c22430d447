from __future__ import annotations

from typing import ClassVar
from uuid import UUID

import pytest
from pydantic import BaseModel, ValidationError

from saga.messaging.envelope import Envelope, message_type_of
from saga.messaging.ids import uuid7


class ReserveCredit(BaseModel):
    customer_id: str
    amount_cents: int


class Named(BaseModel):
    message_type: ClassVar[str] = "customers.Named"
    x: int = 1


def test_wrap_fixes_identity_and_round_trips_through_bytes() -> None:
    envelope = Envelope.wrap(ReserveCredit(customer_id="c1", amount_cents=500), reply_to="orders")
    again = Envelope.from_bytes(envelope.to_bytes())
    assert again == envelope
    assert again.type == "ReserveCredit"
    assert again.correlation_id == envelope.message_id
    assert again.payload == {"customer_id": "c1", "amount_cents": 500}
    assert again.attempt == 1


def test_explicit_message_type_wins_over_class_name() -> None:
    assert message_type_of(Named) == "customers.Named"
    assert message_type_of(Named()) == "customers.Named"
    assert message_type_of(ReserveCredit) == "ReserveCredit"


def test_with_headers_keeps_message_id() -> None:
    envelope = Envelope.wrap(Named())
    retried = envelope.with_headers(attempt="3")
    assert retried.message_id == envelope.message_id
    assert retried.attempt == 3
    assert envelope.attempt == 1


def test_garbage_attempt_header_counts_as_first() -> None:
    assert Envelope.wrap(Named(), headers={"attempt": "x"}).attempt == 1


@pytest.mark.parametrize("body", [b"", b"not json", b"[]", b'{"type": "X"}'])
def test_malformed_bodies_raise_validation_error(body: bytes) -> None:
    with pytest.raises(ValidationError):
        Envelope.from_bytes(body)


def test_uuid7_is_version_7_and_monotonic() -> None:
    ids = [uuid7() for _ in range(10_000)]
    assert all(
        isinstance(i, UUID) and i.version == 7 and i.variant == "specified in RFC 4122" for i in ids
    )
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
