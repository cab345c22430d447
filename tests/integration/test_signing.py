"""Message signing end to end: relay signs, consumer verifies before decoding."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from saga import Outbox
from saga.consumers import Outcome
from saga.errors import ConfigurationError, SignatureRejected
from saga.messaging.envelope import Envelope
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
    with db.connect(autocommit=False) as conn, conn.transaction():
        Outbox().add(conn, Ping(key="signed"), destination=service.name)
    wait_until(lambda: db.scalar("SELECT count(*) FROM effects") == 1, what="signed message")
    body = Envelope.wrap(Ping(key="forged")).to_bytes()
    rabbit.publish_raw(service.name, body, "application/json")  # unsigned
    retired = KeyRing((RETIRED,)).sign(body)
    rabbit.publish_raw(service.name, body, "application/json", headers=retired)
    good = KeyRing((NEW,)).sign(body)
    tampered = body.replace(b"forged", b"f0rged")
    rabbit.publish_raw(service.name, tampered, "application/json", headers=good)
    wait_until(
        lambda: db.scalar("SELECT count(*) FROM saga.dead_letters") == 3, what="three rejected"
    )
    letters = db.rows("SELECT reason, error_type FROM saga.dead_letters ORDER BY id")
    assert letters == [
        ("rejected", "MissingSignature"),
        ("rejected", "UnknownSigningKey"),
        ("rejected", "BadSignature"),
    ]
    assert db.scalar("SELECT count(*) FROM effects") == 1  # no handler ran for them
    assert SIGNATURE_HEADER == "signature"


def test_consumer_counts_signature_rejections(db: TestDatabase, rabbit: TestBroker) -> None:
    db.execute(EFFECTS_DDL)
    ring = KeyRing((NEW,), require=True)
    with running_service(service, db, rabbit, signing=ring) as runner:
        rabbit.publish_raw(
            service.name, Envelope.wrap(Ping(key="x")).to_bytes(), "application/json"
        )
        wait_until(lambda: runner.counts[Outcome.REJECTED] == 1, what="rejected")
