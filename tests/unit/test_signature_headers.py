"""Signature headers are foreign input: any value, of any type, is refused with a reason."""

from __future__ import annotations

from typing import Any

import pytest

from saga.errors import SignatureRejected
from saga.messaging.signing import KEY_HEADER, SIGNATURE_HEADER, KeyRing

RING = KeyRing((("k1", b"a-long-enough-secret!"),), require=True)
BODY = b'{"hello": "world"}'


@pytest.mark.parametrize(
    ("headers", "error_type"),
    [
        ({KEY_HEADER: "k1", SIGNATURE_HEADER: "\x9b2J 東京"}, "BadSignature"),
        ({KEY_HEADER: "k1", SIGNATURE_HEADER: [1, 2]}, "BadSignature"),
        ({KEY_HEADER: "k1", SIGNATURE_HEADER: "\ud800"}, "BadSignature"),
        ({KEY_HEADER: 5, SIGNATURE_HEADER: "x"}, "UnknownSigningKey"),
        ({SIGNATURE_HEADER: "x"}, "UnknownSigningKey"),
    ],
)
def test_a_signature_header_of_any_value_is_refused_with_a_reason(
    headers: dict[str, Any], error_type: str
) -> None:
    with pytest.raises(SignatureRejected) as refused:
        RING.verify(BODY, headers)
    assert refused.value.error_type == error_type
