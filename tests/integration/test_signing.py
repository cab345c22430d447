"""Message signing end to end: relay signs, consumer verifies before decoding."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from saga import Outbox
from saga.consumers import DeliveryOutcome
from saga.errors import ConfigurationError, SignatureRejected
from saga.messaging.envelope import Envelope
from saga.messaging.outbox import DEFAULT_MAX_MESSAGE_BYTES
from saga.messaging.signing import KEY_HEADER, SIGNATURE_HEADER, KeyRing
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.running import running_relay, running_service
from tests.support.services import EFFECTS_DDL, Ping, service
from tests.support.wait import wait_until

NEW = ("k2", b"second-secret-0123456789")
OLD = ("k1", b"first-secret-01234567890")
RETIRED = ("k0", b"retired-secret-012345678")


def test_key_ring_signs_with_the_newest_and_verifies_any_listed() -> None:
    ring = KeyRing((NEW, OLD), require=True)
    body = b'{"hello": "world"}'
    headers = ring.sign(body)
    assert headers[KEY_HEADER] == "k2"
    ring.verify(body, headers)
    ring.verify(body, KeyRing((OLD,)).sign(body))  # an older, still listed key
    with pytest.raises(SignatureRejected) as retired:
        ring.verify(body, KeyRing((RETIRED,)).sign(body))
    assert retired.value.error_type == "UnknownSigningKey"
    tampered = body.replace(b"world", b"w0rld")
    with pytest.raises(SignatureRejected) as bad:
        ring.verify(tampered, headers)
    assert bad.value.error_type == "BadSignature"
    with pytest.raises(SignatureRejected) as missing:
        ring.verify(body, {})
    assert missing.value.error_type == "MissingSignature"
    KeyRing((NEW,)).verify(body, {})  # unsigned is fine when not required


def test_key_ring_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="shorter than 16"):
        KeyRing.parse("k1:short")
    with pytest.raises(ConfigurationError, match="no signing key"):
        KeyRing.parse("", require=True)
    with pytest.raises(ConfigurationError, match="key_id:secret"):
        KeyRing.parse("no-colon")
    assert "secret" not in repr(KeyRing.parse("k1:a-long-enough-secret!"))


@pytest.fixture
def signed(db: TestDatabase, rabbit: TestBroker) -> Iterator[None]:
    db.execute(EFFECTS_DDL)
    ring = KeyRing((NEW, OLD), require=True)
    with (
        running_relay(db, rabbit, signing=ring),
        running_service(service, db, rabbit, signing=ring),
    ):
        yield


def test_signed_messages_flow_and_forged_ones_are_rejected_before_decoding(
    db: TestDatabase, rabbit: TestBroker, signed: None
) -> None:
    """Each forgery is refused for its signature (or its size) with the envelope unread.

    A consumer that parsed first would name the bytes instead (``UndecodableBody``
    for garbage and truncated JSON, ``InvalidPayload`` for JSON that is no envelope),
    and would know the message id of a valid envelope it then refused.
    """
    with db.connect(autocommit=False) as conn, conn.transaction():
        Outbox().add(conn, Ping(key="signed"), destination=service.name)
    wait_until(lambda: db.scalar("SELECT count(*) FROM effects") == 1, what="signed message")
    body = Envelope.wrap(Ping(key="forged")).to_bytes()
    good = KeyRing((NEW,)).sign
    forgeries: list[tuple[bytes, dict[str, str], str]] = [
        (body, {}, "MissingSignature"),
        (body, KeyRing((RETIRED,)).sign(body), "UnknownSigningKey"),
        (body.replace(b"forged", b"f0rged"), good(body), "BadSignature"),
        (b"\x00\xff\xfe not even text", {}, "MissingSignature"),
        (
            body[: len(body) // 2],
            KeyRing((RETIRED,)).sign(body[: len(body) // 2]),
            "UnknownSigningKey",
        ),
        (b'{"hello": "world"}', good(b'{"hello": "there"}'), "BadSignature"),
        (b"[" * 100_000 + b"]" * 100_000, good(b"[]"), "BadSignature"),  # parsing it would nest
        (b"x" * (2 * DEFAULT_MAX_MESSAGE_BYTES), good(body), "MessageTooLarge"),
    ]
    for forged, headers, _ in forgeries:
        rabbit.publish_raw(service.name, forged, "application/json", headers=headers)
    with db.connect(autocommit=False) as conn, conn.transaction():
        Outbox().add(conn, Ping(key="after"), destination=service.name)
    wait_until(
        lambda: db.scalar("SELECT count(*) FROM effects WHERE key = 'after'") == 1,
        what="a signed message behind the forgeries",
    )
    letters = db.rows(
        "SELECT reason, error_type, message_id, message_type, body FROM saga.dead_letters "
        "ORDER BY id"
    )
    assert [(reason, error) for reason, error, *_ in letters] == [
        ("rejected", expected) for _, _, expected in forgeries
    ]
    assert all(mid is None and mtype is None for _, _, mid, mtype, _ in letters)  # unread
    assert [bytes(letter[4]) for letter in letters] == [forged for forged, _, _ in forgeries]
    assert db.scalar("SELECT count(*) FROM effects") == 2  # no handler ran for a forgery
    assert SIGNATURE_HEADER == "signature"


def test_consumer_counts_signature_rejections(db: TestDatabase, rabbit: TestBroker) -> None:
    """An unsigned message is counted, dead-lettered and never handled; the signed one
    behind it is handled."""
    db.execute(EFFECTS_DDL)
    ring = KeyRing((NEW,), require=True)
    unsigned = Envelope.wrap(Ping(key="x")).to_bytes()
    signed = Envelope.wrap(Ping(key="after")).to_bytes()
    with running_service(service, db, rabbit, signing=ring) as runner:
        rabbit.publish_raw(service.name, unsigned, "application/json")
        rabbit.publish_raw(service.name, signed, "application/json", headers=ring.sign(signed))
        wait_until(
            lambda: (
                runner.counts[DeliveryOutcome.REJECTED] == 1
                and runner.counts[DeliveryOutcome.HANDLED] == 1
            ),
            what="the unsigned message rejected and the signed one handled",
        )
    assert db.rows("SELECT key FROM effects") == [("after",)]  # no handler ran for "x"
    assert db.rows("SELECT reason, error_type, body FROM saga.dead_letters") == [
        ("rejected", "MissingSignature", unsigned)
    ]
