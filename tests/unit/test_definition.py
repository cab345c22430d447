"""The saga definition API and the mistakes it reports at registration."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from saga import Saga, SagaRegistry, StepRetry
from saga.errors import ConfigurationError


class Data(BaseModel):
    order_id: str
    amount: int = 1
    note: str | None = None


class Reserve(BaseModel):
    order_id: str
    amount: int


class Reserved(BaseModel):
    reservation_id: str


class Release(BaseModel):
    order_id: str


class Charge(BaseModel):
    order_id: str
    customer_id: str


class Refund(BaseModel):
    charge_id: str
    reason: str = "compensated"


def _noop(tx: Any, d: Data) -> None:
    return None


def _saga(name: str = "s") -> Saga[Data]:
    return Saga(name, data=Data)


def _registered(saga: Saga[Any], **kwargs: Any) -> Saga[Any]:
    return SagaRegistry("home", **kwargs).register(saga)


def test_a_valid_definition_registers_and_keeps_order() -> None:
    saga = _saga()
    saga.local("first", compensate="undo_first")(_noop)
    saga.local_compensation("undo_first")(_noop)
    saga.remote("reserve", service="svc", command=Reserve, reply=Reserved, compensate=Release)
    saga.remote("pivot", service="svc", command=Reserve, pivot=True)
    saga.local("last")(_noop)
    _registered(saga)
    assert [s.name for s in saga.steps] == ["first", "reserve", "pivot", "last"]
    assert saga.after_pivot("last") and not saga.after_pivot("pivot")


def test_message_class_as_command_is_built_from_the_data_fields() -> None:
    saga = _saga()
    saga.remote("reserve", service="svc", command=Reserve)
    step = saga.steps[0]
    assert step.command(Data(order_id="o1", amount=5)) == Reserve(order_id="o1", amount=5)


def test_duplicate_step_names_are_reported() -> None:
    saga = _saga()
    saga.local("a")(_noop)
    saga.local("a")(_noop)
    with pytest.raises(ConfigurationError, match="duplicate step name 'a'"):
        _registered(saga)


def test_compensation_after_the_pivot_is_reported() -> None:
    saga = _saga()
    saga.remote("pay", service="svc", command=Reserve, pivot=True)
    saga.remote("ship", service="svc", command=Reserve, compensate=Release)
    with pytest.raises(ConfigurationError, match="'ship' comes after the pivot 'pay'"):
        _registered(saga)


def test_command_type_with_no_route_is_reported() -> None:
    saga = _saga()
    saga.remote("reserve", command=Reserve)
    with pytest.raises(ConfigurationError, match="command type Reserve has no route"):
        _registered(saga)


def test_routes_supply_the_service() -> None:
    saga = _saga()
    saga.remote("reserve", command=Reserve)
    _registered(saga, routes={Reserve: "inventory"})
    assert saga.service_of(saga.steps[0]) == "inventory"  # type: ignore[arg-type]


def test_untyped_lambda_without_service_is_reported() -> None:
    saga = _saga()
    saga.remote("reserve", command=lambda d: Reserve(order_id=d.order_id, amount=1))
    with pytest.raises(ConfigurationError, match="command's type is unknown"):
        _registered(saga)


def test_annotated_function_gives_the_command_type() -> None:
    def build(d: Data) -> Reserve:
        return Reserve(order_id=d.order_id, amount=d.amount)

    saga = _saga()
    saga.remote("reserve", command=build)
    _registered(saga, routes={Reserve: "inventory"})
    step = saga.steps[0]
    assert step.command_type is Reserve  # type: ignore[union-attr]
    assert saga.service_of(step) == "inventory"  # type: ignore[arg-type]  # routed by that type


def test_unknown_local_compensation_name_is_reported() -> None:
    saga = _saga()
    saga.local("a", compensate="missing")(_noop)
    with pytest.raises(ConfigurationError, match="names compensation 'missing'"):
        _registered(saga)


def test_a_message_built_from_fields_the_data_lacks_is_reported_at_registration() -> None:
    saga = _saga("checkout")
    saga.remote("charge", service="payments", command=Charge, compensate=Refund)
    with pytest.raises(ConfigurationError) as info:
        _registered(saga)
    problems = str(info.value)
    assert problems.startswith("saga 'checkout' v1 is invalid")
    assert "step 'charge': its command Charge is built from the fields of Data" in problems
    assert "lacks its required field(s) customer_id;" in problems
    assert "its compensation Refund" in problems and "field(s) charge_id;" in problems


def test_a_message_that_does_not_validate_names_saga_step_and_field() -> None:
    saga = _saga("checkout")
    saga.remote(
        "charge",
        service="payments",
        command=lambda d: Charge(order_id=d.order_id, customer_id=d.note),
    )
    _registered(saga)  # a function of the data is checked only when it runs
    with pytest.raises(ConfigurationError) as info:
        saga.build_message(saga.steps[0], Data(order_id="o1"))  # type: ignore[arg-type]
    assert str(info.value).startswith(
        "saga 'checkout' v1 step 'charge': cannot build its command Charge from Data: "
        "customer_id: Input should be a valid string"
    )

    failing = _saga("refunds")
    failing.remote("refund", service="payments", command=lambda d: Refund(charge_id=d.charge))
    with pytest.raises(ConfigurationError) as info:
        failing.build_message(failing.steps[0], Data(order_id="o1"))  # type: ignore[arg-type]
    assert str(info.value) == (
        "saga 'refunds' v1 step 'refund': cannot build its command: "
        "AttributeError: 'Data' object has no attribute 'charge'"
    )


def test_every_problem_is_listed_at_once() -> None:
    saga = _saga()
    saga.local("a")(_noop)
    saga.local("a")(_noop)
    saga.remote("b", command=Reserve)
    with pytest.raises(ConfigurationError) as info:
        _registered(saga)
    assert "duplicate step name" in str(info.value) and "has no route" in str(info.value)


def test_two_pivots_and_empty_sagas_are_reported() -> None:
    saga = _saga()
    saga.remote("p1", service="s", command=Reserve, pivot=True)
    saga.remote("p2", service="s", command=Reserve, pivot=True)
    with pytest.raises(ConfigurationError, match="more than one pivot"):
        _registered(saga)
    with pytest.raises(ConfigurationError, match="no steps"):
        _registered(_saga())


def test_registering_the_same_version_twice_is_refused() -> None:
    registry = SagaRegistry("home")
    first = _saga()
    first.local("a")(_noop)
    second = _saga()
    second.local("a")(_noop)
    registry.register(first)
    with pytest.raises(ConfigurationError, match="registered twice"):
        registry.register(second)


def test_reply_type_names_must_be_unique_across_classes() -> None:
    other = type("Reserved", (BaseModel,), {"__annotations__": {"x": int}})
    registry = SagaRegistry("home")
    a = _saga("a")
    a.remote("r", service="s", command=Reserve, reply=Reserved)
    b = _saga("b")
    b.remote("r", service="s", command=Reserve, reply=other)
    registry.register(a)
    with pytest.raises(ConfigurationError, match="used by two classes"):
        registry.register(b)


def test_bad_arguments_fail_fast() -> None:
    with pytest.raises(ConfigurationError, match="pydantic model"):
        Saga("x", data=dict)  # type: ignore[type-var]
    with pytest.raises(ConfigurationError, match="version"):
        Saga("x", data=Data, version=0)
    with pytest.raises(ConfigurationError):
        Saga("bad name", data=Data)


def test_starting_an_unregistered_saga_says_so() -> None:
    saga = _saga()
    saga.local("a")(_noop)
    with pytest.raises(ConfigurationError, match="not registered"):
        saga.start(None, Data(order_id="x"))  # type: ignore[arg-type]


def test_step_retry_backoff_is_capped() -> None:
    retry = StepRetry(attempts=10, initial_delay=1, max_delay=5)
    assert [retry.delay(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]


def test_registry_service_handles_every_reply_type() -> None:
    saga = _saga()
    saga.remote("r", service="s", command=Reserve, reply=Reserved)
    registry = SagaRegistry("home")
    registry.register(saga)
    assert registry.as_service().message_types == [
        "Reserved",
        "saga.Ack",
        "saga.FailureReply",
        "saga.ResumeSaga",
        "saga.Signal",
        "saga.StartSaga",
        "saga.StepDeadline",
        "saga.StepTimer",
        "saga.WaitTimeout",
    ]
    late = _saga("late")
    late.local("a")(_noop)
    with pytest.raises(ConfigurationError, match="before the registry's service starts"):
        registry.register(late)


def test_a_misspelt_on_deadline_is_refused() -> None:
    saga = _saga()
    with pytest.raises(ConfigurationError, match="on_deadline must be"):
        saga.remote("reserve", service="inv", command=Reserve, on_deadline="compensat")
