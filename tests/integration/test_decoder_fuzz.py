"""The consumer's decoder, fuzzed through its real path on PostgreSQL.

Hypothesis builds deliveries from bodies (bytes, JSON that is no envelope, envelopes with
one field of a wrong type or missing, unknown types, invalid payloads, oversized ones and
good ones), content types, content encodings, signature headers (valid, forged, by an
unknown key, missing, of the wrong type) and compression headers the body does not match,
and publishes each, followed by a good message, onto a PostgreSQL broker's queue that a
signing service consumes. Each delivery must end once: handled, or dead-lettered with the
reason its first flaw calls for (a body the broker's client could not read, then size,
then signature, then content type, then the body). The consumer never stops, and every good
message behind the bad ones is handled.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from saga.consumers import ServiceRunner
from saga.messaging.envelope import Envelope
from saga.messaging.signing import KEY_HEADER, SIGNATURE_HEADER, KeyRing
from tests.support.brokers import RawMessage, TestBroker
from tests.support.databases import TestDatabase
from tests.support.hostile import hostile_text
from tests.support.running import running_service
from tests.support.services import EFFECTS_DDL, Ping, service
from tests.support.wait import wait_until

MAX_BYTES = 4_096
KEY = ("k1", b"fuzz-secret-0123456789")
RING = KeyRing((KEY,), require=True)
JSON = "application/json"
_keys = count()


@dataclass(frozen=True)
class Case:
    """One delivery and what must become of it (None: handled)."""

    message: RawMessage
    expected: str | None
    key: str | None = None  # the Ping's key, when it is one


@dataclass(frozen=True)
class Body:
    """A body and the rejection it calls for once size, signature and content type pass."""

    data: bytes
    rejection: str | None
    key: str | None = None


def _ping(key: str | None = None) -> tuple[Envelope, str]:
    key = key if key is not None else f"fuzz-{next(_keys)}"
    return Envelope.wrap(Ping(key=key, n=1)), key


def _good_body() -> Body:
    envelope, key = _ping()
    return Body(envelope.to_bytes(), None, key)


def _with(document: dict[str, Any], **changes: Any) -> bytes:
    return json.dumps({**document, **changes}).encode()


def _envelope_document() -> dict[str, Any]:
    return _ping()[0].model_dump(mode="json")


_NOT_STR = st.sampled_from([5, 1.5, True, [], {}, ["x"], {"a": "b"}])
_NOT_UUID = st.one_of(_NOT_STR, st.sampled_from(["not-a-uuid", "", "1234"]))
#: Per envelope field, values of a type the envelope refuses.
WRONG = {
    "message_id": st.one_of(_NOT_UUID, st.none()),
    "type": st.one_of(_NOT_STR, st.none()),
    "saga_id": _NOT_UUID,
    "correlation_id": _NOT_UUID,
    "causation_id": _NOT_UUID,
    "reply_to": _NOT_STR,
    "headers": st.sampled_from([[], "x", 5, {"k": 5}, {"k": None}, {"k": ["v"]}]),
    "created_at": st.sampled_from([True, [], {}, "yesterday", None, "2026-13-45T99:00:00"]),
    "payload": st.sampled_from([[], "x", 5, True, None]),
}
REQUIRED = ("message_id", "type", "created_at", "payload")
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def bodies(draw: st.DrawFn) -> Body:
    kind = draw(
        st.sampled_from(
            ["good", "bytes", "json", "wrong_type", "missing", "unknown_type", "payload", "big"]
        )
    )
    if kind == "good":
        return _good_body()
    if kind == "bytes":
        return Body(draw(st.binary(max_size=200)), "UndecodableBody")
    if kind == "json":
        value = draw(JSON_VALUES.filter(lambda v: not isinstance(v, dict)))
        return Body(json.dumps(value).encode(), "UndecodableBody")
    document = _envelope_document()
    if kind == "wrong_type":
        name = draw(st.sampled_from(sorted(WRONG)))
        return Body(_with(document, **{name: draw(WRONG[name])}), "UndecodableBody")
    if kind == "missing":
        del document[draw(st.sampled_from(REQUIRED))]
        return Body(json.dumps(document).encode(), "UndecodableBody")
    if kind == "unknown_type":
        message_type = draw(hostile_text().filter(lambda t: t not in service.message_types))
        return Body(_with(document, type=message_type), "UnknownMessageType")
    if kind == "payload":
        wrong = draw(st.sampled_from([{"key": 5}, {"key": None}, {"n": 1}, {"key": "k", "n": "x"}]))
        return Body(_with(document, payload=wrong), "InvalidPayload")
    padding = "x" * draw(st.integers(MAX_BYTES, MAX_BYTES * 2))
    return Body(_ping(padding)[0].to_bytes(), "MessageTooLarge")


#: Signature headers: how to sign a body, and the rejection each calls for (None: valid).
SIGNATURES: dict[str, tuple[Any, str | None]] = {
    "valid": (lambda body, _: RING.sign(body), None),
    "forged": (lambda body, text: {KEY_HEADER: KEY[0], SIGNATURE_HEADER: text}, "BadSignature"),
    "of another body": (lambda body, _: RING.sign(body + b" "), "BadSignature"),
    "not text": (lambda body, _: {KEY_HEADER: KEY[0], SIGNATURE_HEADER: [1, 2]}, "BadSignature"),
    "unknown key": (
        lambda body, text: {KEY_HEADER: f"other {text}", **_digest_only(body)},
        "UnknownSigningKey",
    ),
    "key not text": (lambda body, _: {KEY_HEADER: 5, **_digest_only(body)}, "UnknownSigningKey"),
    "missing": (lambda body, _: {}, "MissingSignature"),
}


def _digest_only(body: bytes) -> dict[str, Any]:
    return {SIGNATURE_HEADER: RING.sign(body)[SIGNATURE_HEADER]}


@st.composite
def cases(draw: st.DrawFn) -> Case:
    body = draw(bodies())
    how = draw(st.sampled_from(["valid", "valid", "valid", *sorted(SIGNATURES)]))
    sign, signature_rejection = SIGNATURES[how]
    headers = sign(body.data, draw(hostile_text()))
    content_type = draw(
        st.sampled_from(
            [JSON, JSON, "application/json; charset=utf-8", "APPLICATION/JSON",
             "application/x-python-serialize", "text/plain", "", "application/jsonx"]
        )
    )  # fmt: skip
    compression = draw(st.sampled_from([None, None, None, "bogus", 5, "application/x-gzip"]))
    if compression is not None:  # the broker's client cannot decompress what is not so
        headers["compression"] = compression
    media_type = content_type.split(";", 1)[0].strip().lower()
    if compression is not None:
        expected = "UndecodableBody"
    elif len(body.data) > MAX_BYTES:
        expected = "MessageTooLarge"
    elif signature_rejection is not None:
        expected = signature_rejection
    elif media_type != JSON:
        expected = "ContentTypeRejected"
    else:
        expected = body.rejection
    # The content_encoding property is the publisher's word only: the body is read as bytes.
    encoding = draw(st.sampled_from([None, "utf-8", "binary", "latin-1", "gzip", "rot13"]))
    return Case(RawMessage(body.data, content_type, headers, encoding), expected, body.key)


@dataclass
class Published:
    """Deliveries published so far to the running consumer, over every example."""

    total: int = 0
    keys: list[str] = field(default_factory=list)


@pytest.fixture
def signing_consumer(db: TestDatabase, pg_broker: TestBroker) -> Iterator[ServiceRunner]:
    db.execute(EFFECTS_DDL)
    with running_service(
        service, db, pg_broker, signing=RING, max_message_bytes=MAX_BYTES
    ) as runner:
        yield runner


FUZZ = settings(
    max_examples=25,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@given(batch=st.lists(cases(), min_size=1, max_size=6))
@FUZZ
def test_every_delivery_is_handled_or_dead_lettered_with_its_reason_once(
    db: TestDatabase,
    pg_broker: TestBroker,
    signing_consumer: ServiceRunner,
    batch: list[Case],
) -> None:
    db.execute("TRUNCATE saga.dead_letters, public.effects")
    deliveries: list[RawMessage] = []
    goods: list[str] = []
    for case in batch:
        envelope, key = _ping()
        goods.append(key)
        body = envelope.to_bytes()
        deliveries += [case.message, RawMessage(body, JSON, RING.sign(body))]
    before = sum(signing_consumer.counts.values())
    pg_broker.publish_each(service.name, deliveries)
    wait_until(
        lambda: sum(signing_consumer.counts.values()) == before + len(deliveries),
        what="every delivery settled",
    )
    assert signing_consumer.failure is None
    letters = Counter(
        (bytes(body), error_type)
        for body, error_type, reason in db.rows(
            "SELECT body, error_type, reason FROM saga.dead_letters"
        )
        if reason == "rejected"
    )
    assert db.scalar("SELECT count(*) FROM saga.dead_letters WHERE reason <> 'rejected'") == 0
    assert letters == Counter((c.message.body, c.expected) for c in batch if c.expected is not None)
    handled = Counter(key for (key,) in db.rows("SELECT key FROM public.effects"))
    expected_keys = goods + [c.key for c in batch if c.expected is None and c.key]
    assert handled == Counter(expected_keys)
