from __future__ import annotations

import pickle
import uuid
from datetime import timedelta

import pytest
from pydantic import BaseModel

from saga import RetryPolicy, Service
from saga.consumers import ConsumerOptions
from saga.consumers.decoding import decode
from saga.errors import ConfigurationError, Rejection, StepFailed
from saga.messaging.envelope import Envelope
from saga.messaging.leases import Leases


class Cmd(BaseModel):
    n: int


svc = Service("svc")


@svc.handler(Cmd)
def handle(tx: object, msg: Cmd, ctx: object) -> None:
    return None


def test_duplicate_handler_registration_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="already has a handler for 'Cmd'"):
        svc.add_handler(Cmd, handle)


def test_handler_class_must_be_a_pydantic_model() -> None:
    with pytest.raises(ConfigurationError, match="pydantic model"):
        Service("x").add_handler(dict, handle)  # type: ignore[arg-type]


def _reject(body: bytes, content_type: str | None = "application/json") -> Rejection:
    with pytest.raises(Rejection) as info:
        decode(body, content_type, svc, max_bytes=1024)
    return info.value


def test_decode_accepts_a_valid_envelope() -> None:
    decoded = decode(Envelope.wrap(Cmd(n=3)).to_bytes(), "application/json", svc, 1024)
    assert decoded.message == Cmd(n=3)
    assert decoded.spec.func is handle


def test_decode_rejections_name_their_reason() -> None:
    assert _reject(pickle.dumps(1), "application/x-python-serialize").error_type == (
        "ContentTypeRejected"
    )
    assert _reject(b"{", "application/json").error_type == "UndecodableBody"
    assert _reject(b"x" * 2000).error_type == "MessageTooLarge"
    unknown = Envelope.wrap(Cmd(n=1)).model_copy(update={"type": "Nope"})
    assert _reject(unknown.to_bytes()).error_type == "UnknownMessageType"
    bad = Envelope.wrap(Cmd(n=1)).model_copy(update={"payload": {"n": "not a number"}})
    rejection = _reject(bad.to_bytes())
    assert rejection.error_type == "InvalidPayload"
    assert "n:" in rejection.message
    assert rejection.message_id == bad.message_id


def test_a_rejection_names_the_message_its_envelope_describes() -> None:
    """What the dead letter records of a rejected message: its id, type and saga, when
    the envelope could be read; nothing of it when it could not."""
    saga_id = uuid.uuid4()
    unknown = Envelope.wrap(Cmd(n=1), saga_id=saga_id).model_copy(update={"type": "Nope"})
    rejection = _reject(unknown.to_bytes())
    assert (rejection.message_id, rejection.message_type, rejection.saga_id) == (
        unknown.message_id,
        "Nope",
        saga_id,
    )
    unreadable = _reject(b"{")
    assert (unreadable.message_id, unreadable.message_type, unreadable.saga_id) == (None,) * 3


def test_content_type_parameters_are_tolerated() -> None:
    body = Envelope.wrap(Cmd(n=1)).to_bytes()
    assert decode(body, "application/json; charset=utf-8", svc, 1024).message == Cmd(n=1)


def test_retry_policy_counts_and_delays() -> None:
    policy = RetryPolicy(immediate_attempts=3, delays=(1.0, 10.0), delay_jitter=0.0)
    assert policy.total_attempts == 9
    assert policy.delay_after(1) == timedelta(seconds=1)
    assert policy.delay_after(2) == timedelta(seconds=10)
    assert policy.delay_after(3) is None
    assert not policy.is_retriable(StepFailed("no"))
    assert policy.is_retriable(RuntimeError())


def test_retry_policy_never_retry_and_validation() -> None:
    policy = RetryPolicy(never_retry=(ValueError,))
    assert not policy.is_retriable(ValueError())
    with pytest.raises(ConfigurationError):
        RetryPolicy(immediate_attempts=0)
    with pytest.raises(ConfigurationError):
        RetryPolicy(delays=(-1.0,))


def test_immediate_retries_use_tenacity_and_stop_on_step_failed() -> None:
    calls = 1  # the first try, made before any retry controller is built

    def always(exc: Exception) -> None:
        nonlocal calls
        calls += 1
        raise exc

    policy = RetryPolicy(immediate_attempts=3, immediate_initial_wait=0.0)
    with pytest.raises(RuntimeError):
        policy.retries()(always, RuntimeError())
    assert calls == 3
    calls = 0
    with pytest.raises(StepFailed):
        policy.retries()(always, StepFailed("no"))
    assert calls == 1


def test_retries_after_a_failed_first_try_make_up_the_rest_of_the_attempts() -> None:
    calls = 0

    def fail() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError

    with pytest.raises(RuntimeError):
        RetryPolicy(immediate_attempts=4, immediate_initial_wait=0.0).retries()(fail)
    assert calls == 3


def test_a_publish_lease_must_be_positive() -> None:
    with pytest.raises(ValueError, match="publish_lease must be positive seconds, not 0"):
        ConsumerOptions(publish_lease=0)
    with pytest.raises(ValueError, match="a publish lease must be positive"):
        Leases(timedelta(seconds=-1))
    assert ConsumerOptions().publish_lease == Leases().lease.total_seconds() == 5.0
