"""Declaring a saga: its data model and its ordered, named steps, in one place.

>>> create_order = Saga("create_order", data=OrderData, version=1)   # doctest: +SKIP
>>> @create_order.local("create_pending_order", compensate="reject_order")
... def create_pending_order(tx, data): ...
>>> create_order.remote("reserve_credit", service="customers",
...     command=lambda d: ReserveCredit(...), reply=CreditReserved,
...     on_reply=lambda d, r: d.model_copy(update={"reservation_id": r.reservation_id}),
...     compensate=lambda d: ReleaseCredit(reservation_id=d.reservation_id))

Steps run in declaration order. A step marked ``pivot=True`` is the point of
no return: the steps after it are retried until they succeed and are never
compensated. Mistakes are reported by :meth:`Saga.validate` (run when the
saga is registered), not when a saga instance first reaches them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Generic, Protocol, TypeVar, cast
from uuid import UUID

from pydantic import BaseModel, ValidationError

from saga.db.sql import AsyncTx, Tx, validate_name
from saga.engine.builders import as_builder, message_class
from saga.engine.saga_data import check_storable
from saga.engine.steps import ForEach, LocalStep, ParallelGroup, RemoteStep, Step, WaitStep
from saga.engine.steps.kind import StepKind
from saga.engine.steps.options import (
    COMPENSATE,
    HOLD,
    RETRY,
    KeyOf,
    LocalAction,
    StepRetry,
)
from saga.engine.steps.parallel import Member
from saga.errors import ConfigurationError
from saga.messaging.envelope import message_type_of

__all__ = [
    "COMPENSATE",
    "HOLD",
    "RETRY",
    "ForEach",
    "LocalAction",
    "LocalStep",
    "MigrationRule",
    "ParallelGroup",
    "RemoteStep",
    "Saga",
    "Step",
    "StepRetry",
    "WaitStep",
]

D = TypeVar("D", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)
Item = TypeVar("Item")  # an item of a fan-out


DEFAULT_MAX_DATA_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class MigrationRule:
    """How running sagas of ``from_version`` move to the version that declares the rule.

    A saga moves unless its recorded progress shows it completed ``unless_passed``.
    """

    from_version: int
    unless_passed: str


@dataclass(slots=True)
class _Draft:
    local_compensations: dict[str, LocalAction] = field(default_factory=dict)
    group: list[Member] | None = None  # the members of ``with parallel()``


class SagaHost(Protocol):
    """What a saga needs from the registry it is registered with."""

    routes: dict[type[BaseModel], str]

    def start(
        self, tx: Tx, saga: Saga[Any], data: BaseModel, *, idempotency_key: str | None = None
    ) -> UUID: ...

    async def start_async(
        self,
        tx: AsyncTx,
        saga: Saga[Any],
        data: BaseModel,
        *,
        idempotency_key: str | None = None,
    ) -> UUID: ...


class Saga(Generic[D]):
    """A named, versioned saga definition over a pydantic data model."""

    def __init__(
        self,
        name: str,
        *,
        data: type[D],
        version: int = 1,
        retry: StepRetry | None = None,
        max_data_bytes: int = DEFAULT_MAX_DATA_BYTES,
    ) -> None:
        self.name = validate_name(name, "saga name")
        if not (isinstance(data, type) and issubclass(data, BaseModel)):
            raise ConfigurationError(f"saga {name!r}: data must be a pydantic model class")
        if version < 1:
            raise ConfigurationError(f"saga {name!r}: version must be 1 or more")
        self.data_model = data
        self.version = version
        self.retry = retry or StepRetry()
        self.max_data_bytes = max_data_bytes
        self.steps: list[Step] = []
        self.migrations: list[MigrationRule] = []
        self._draft = _Draft()
        self.registry: SagaHost | None = None  # the registry this saga was registered with

    def __repr__(self) -> str:
        return f"Saga({self.name!r}, version={self.version}, steps={[s.name for s in self.steps]})"

    def check_data(self, data: BaseModel) -> None:
        """Refuse data that cannot be stored (too large, or holding a NUL character)."""
        check_storable(self.name, data, self.max_data_bytes)

    # -- declaring steps -----------------------------------------------------

    def local(
        self,
        name: str,
        *,
        compensate: Callable[[Tx, D], D | None] | str | None = None,
        when: Callable[[D], bool] | None = None,
        pivot: bool = False,
        retry: StepRetry | None = None,
    ) -> Callable[[Callable[[Tx, D], D | None]], Callable[[Tx, D], D | None]]:
        """Decorator: ``fn(tx, data)`` runs in the orchestrator's transaction.

        It may return a new data object (saved with the saga) or None.
        ``retry`` overrides the saga's :class:`StepRetry` for this step's compensation.
        """

        def register(action: Callable[[Tx, D], D | None]) -> Callable[[Tx, D], D | None]:
            self._add(LocalStep(name, action, compensate, when, pivot, retry))
            return action

        return register

    def local_compensation(
        self, name: str
    ) -> Callable[[Callable[[Tx, D], D | None]], Callable[[Tx, D], D | None]]:
        """Decorator: a named local compensation, referred to by ``compensate="name"``."""

        def register(action: Callable[[Tx, D], D | None]) -> Callable[[Tx, D], D | None]:
            if name in self._draft.local_compensations:
                raise ConfigurationError(f"saga {self.name!r}: compensation {name!r} defined twice")
            self._draft.local_compensations[name] = action
            return action

        return register

    def remote(
        self,
        name: str,
        *,
        command: Callable[[D], BaseModel] | type[BaseModel],
        service: str | None = None,
        reply: type[R] | None = None,
        on_reply: Callable[[D, R], D] | None = None,
        compensate: Callable[[D], BaseModel] | type[BaseModel] | None = None,
        compensate_service: str | None = None,
        when: Callable[[D], bool] | None = None,
        pivot: bool = False,
        retry: StepRetry | None = None,
        deadline: timedelta | None = None,
        on_deadline: str = RETRY,
        on_dead_letter: str = COMPENSATE,
    ) -> None:
        """A step that sends ``command(data)`` to ``service`` and waits for its reply.

        ``command`` (and ``compensate``) is a function of the saga data, or a
        message class built from the data's fields of the same names.
        ``on_reply(data, reply)`` returns the updated data. ``retry`` overrides the
        saga's :class:`StepRetry` for this step (after the pivot) and its compensation.
        With a ``deadline``, a reply that has not come in time makes the saga send
        the command again (``on_deadline="retry"``, same message id, up to the
        retry attempts) or compensate, this step included
        (``on_deadline="compensate"``).

        When the participant gives up on the command (it becomes a dead letter there),
        its outcome is unknown: it may have had its effect. ``on_dead_letter="compensate"``
        compensates the saga, this step included; ``on_dead_letter="hold"`` keeps the saga
        at this step (status ``step_dead_lettered``) until an operator replays the letter
        (the saga goes on) or purges it (the saga compensates, this step included).
        Either way a compensation must tolerate "nothing to undo".
        """
        self._add(
            RemoteStep(
                name=name,
                command=as_builder(command),
                service=service,
                command_type=message_class(command),
                reply=reply,
                on_reply=on_reply,
                compensation=as_builder(compensate) if compensate is not None else None,
                compensation_service=compensate_service,
                when=when,
                pivot=pivot,
                retry=retry,
                deadline=deadline,
                on_deadline=on_deadline,
                on_dead_letter=on_dead_letter,
            )
        )

    def wait(
        self,
        name: str,
        *,
        event: str | type[R],
        payload: type[R] | None = None,
        timeout: timedelta | None = None,
        on_event: Callable[[D, R], D] | None = None,
        on_timeout: str = COMPENSATE,
        when: Callable[[D], bool] | None = None,
        correlate: Callable[[D], object] | None = None,
        event_key: str | Callable[[R], object] | None = None,
    ) -> None:
        """A step that waits for ``event``: a name (``saga signal``; its data validated as
        ``payload``), or a published event's class, with ``correlate`` (the key in the saga's
        data) and ``event_key`` (the field of the event, or a function of it, that carries
        the key): the first such event with this saga's key ends the wait.

        The saga's home service subscribes to the event. One that comes before the saga
        waits for it is kept (``early_events``) and ends the wait as soon as it begins.
        """
        if isinstance(event, type):
            if correlate is None or event_key is None:
                raise ConfigurationError(
                    f"wait step {name!r} waits for the published event {event.__name__}: say "
                    "which one with correlate= (the key in the saga data) and event_key= "
                    "(the event's field, or a function of the event, that carries it)"
                )
            payload, event_name = event, message_type_of(event)
        elif correlate is not None or event_key is not None:
            raise ConfigurationError(
                f"wait step {name!r}: correlate= and event_key= need a published event's "
                f"class as event=, not the signal name {event!r}"
            )
        elif payload is None:
            raise ConfigurationError(f"wait step {name!r}: give payload= for signal {event!r}")
        else:
            event_name = event
        if self._draft.group is not None:
            raise ConfigurationError(
                f"wait step {name!r} cannot be a member of a parallel group: declare it "
                "before or after the `with saga.parallel(...)` block"
            )
        step = WaitStep(name, event_name, payload, timeout, on_event, on_timeout, when)
        self.steps.append(replace(step, correlate=correlate, event_key=_key_of(event_key)))

    @contextmanager
    def parallel(self, name: str, *, when: Callable[[D], bool] | None = None) -> Iterator[None]:
        """Steps declared in this block run at once, as one step called ``name``.

        >>> with order.parallel("reserve"):                      # doctest: +SKIP
        ...     order.remote("reserve_stock", command=ReserveStock, ...)
        ...     order.remote("reserve_credit", command=ReserveCredit, ...)

        Every member starts when the saga reaches the group (their commands leave in one
        transaction); the saga goes on when all have answered. If one fails, the members
        that succeeded and the steps before the group are compensated, latest first; a
        member still out then is compensated if its success comes later. Members are local
        or remote steps with their own options (deadlines, ``on_dead_letter``), or fan-outs
        (``for_each``: its first items leave with the other members, and the group waits for
        every item); a member may not be the pivot, and a group may not come after the
        pivot. See docs/sagas.md.
        """
        if self._draft.group is not None:
            raise ConfigurationError(f"parallel group {name!r}: groups do not nest")
        members: list[Member] = []
        self._draft.group = members
        try:
            yield
        finally:
            self._draft.group = None
        self.steps.append(ParallelGroup(name, tuple(members), when))

    def for_each(
        self,
        name: str,
        *,
        items: Callable[[D], Sequence[Item]],
        service: str,
        command: Callable[[D, Item], BaseModel],
        reply: type[R] | None = None,
        on_reply: Callable[[D, Item, R], D] | None = None,
        compensate: Callable[[D, Item], BaseModel] | None = None,
        compensate_service: str | None = None,
        max_in_flight: int = 10,
        key: Callable[[Item], object] | None = None,
        when: Callable[[D], bool] | None = None,
        retry: StepRetry | None = None,
    ) -> None:
        """A step that sends ``command(data, item)`` to ``service`` for each item of
        ``items(data)``, at most ``max_in_flight`` at once, and goes on once all succeeded.

        >>> order.for_each("reserve_lines", items=lambda d: d.lines,     # doctest: +SKIP
        ...     service="stock", command=lambda d, line: ReserveLine(sku=line.sku),
        ...     reply=LineReserved, on_reply=lambda d, line, r: d.model_copy(...),
        ...     compensate=lambda d, line: ReleaseLine(sku=line.sku), key=lambda l: l.sku)

        Each item's command carries its own idempotency key, made of its position and its
        identity (``key(item)``, or a digest of the item); the items must stay as they are
        while the step runs. ``on_reply(data, item, reply)`` gathers each result into the
        data. When an item fails, no further item is sent; once those still out answered,
        the items that took effect are compensated (latest first), then the steps before.
        ``retry`` applies to the compensations. A fan-out may not come after the pivot. In a
        ``with saga.parallel(...)`` block it is a member of the group: an item that fails
        fails the group at once, and an item still out then is undone if its success comes
        later. See docs/sagas.md, "For each item".
        """
        self._add(
            ForEach(
                name=name,
                items=items,
                service=service,
                command=command,
                reply=reply,
                on_reply=on_reply,
                compensation=compensate,
                compensation_service=compensate_service,
                max_in_flight=max_in_flight,
                key=key,
                when=when,
                retry=retry,
            )
        )

    def _add(self, step: Member) -> None:
        """A declared step: the saga's next one, or a member of the group being declared."""
        (self.steps if self._draft.group is None else self._draft.group).append(step)

    def migrate_from(self, version: int, *, unless_passed: str) -> None:
        """Move running sagas of ``version`` to this one, except those past ``unless_passed``.

        Run with ``saga migrate-instances NAME --to THIS_VERSION``. Guards read each
        saga's recorded progress, never the clock or the code.
        """
        self.migrations.append(MigrationRule(version, unless_passed))

    def migration_from(self, version: int) -> MigrationRule | None:
        return next((m for m in self.migrations if m.from_version == version), None)

    # -- inspection ----------------------------------------------------------

    def step(self, name: str) -> Step:
        """The step called ``name``, at the top or inside another step."""
        step = self.find(name)
        if step is not None:
            return step
        raise KeyError(f"saga {self.name!r} v{self.version} has no step {name!r}")

    def find(self, name: str) -> Step | None:
        """The step called ``name`` (at the top or inside another step); None if none is."""
        for step in self.steps:
            for part in step.parts():
                if part.name == name:
                    return cast("Step", part)  # the parts of a step are steps
        return None

    def index(self, name: str) -> int:
        """The place of step ``name`` in the saga (a step inside another: the outer one's)."""
        for i, step in enumerate(self.steps):
            if any(part.name == name for part in step.parts()):
                return i
        raise KeyError(f"saga {self.name!r} v{self.version} has no step {name!r}")

    @property
    def pivot_index(self) -> int | None:
        for i, step in enumerate(self.steps):
            if step.pivot:
                return i
        return None

    def after_pivot(self, name: str) -> bool:
        """True for steps that only go forward (after the pivot step)."""
        pivot = self.pivot_index
        return pivot is not None and self.index(name) > pivot

    def retry_for(self, step: StepKind) -> StepRetry:
        return step.retry or self.retry

    def defines_local_compensation(self, name: str) -> bool:
        """True when a ``@local_compensation`` of this saga is called ``name``."""
        return name in self._draft.local_compensations

    def local_compensation_for(self, step: LocalStep) -> LocalAction | None:
        if step.compensation is None or callable(step.compensation):
            return step.compensation
        return self._draft.local_compensations[step.compensation]

    def compensation_service(self, step: RemoteStep) -> str:
        return step.compensation_service or self.service_of(step)

    def service_of(self, step: RemoteStep) -> str:
        if step.service:
            return step.service
        routes = self.registry.routes if self.registry is not None else {}
        if step.command_type is not None and step.command_type in routes:
            return routes[step.command_type]
        raise ConfigurationError(f"saga {self.name!r}: step {step.name!r} has no route")

    def start(self, tx: Tx, data: D, *, idempotency_key: str | None = None) -> UUID:
        """Start an instance in the caller's transaction (the saga must be registered)."""
        return self._home().start(tx, self, data, idempotency_key=idempotency_key)

    async def start_async(
        self, tx: AsyncTx, data: D, *, idempotency_key: str | None = None
    ) -> UUID:
        """:meth:`start` on an async connection (see ``SagaRegistry.start_async``)."""
        return await self._home().start_async(tx, self, data, idempotency_key=idempotency_key)

    def _home(self) -> SagaHost:
        """The registry this saga is registered with."""
        if self.registry is None:
            raise ConfigurationError(
                f"saga {self.name!r} is not registered: call SagaRegistry(...).register(saga) first"
            )
        return self.registry

    def build_message(
        self, step: RemoteStep, data: BaseModel, *, compensation: bool = False
    ) -> BaseModel:
        """The step's command (or its compensation) for ``data``. Building that fails raises
        :class:`ConfigurationError` naming the saga, the step and (when the message does not
        validate) the fields."""
        builder = step.compensation if compensation else step.command
        assert builder is not None
        what = "compensation" if compensation else "command"
        where = f"saga {self.name!r} v{self.version} step {step.name!r}: cannot build its {what}"
        try:
            return builder(data)
        except ValidationError as exc:
            fields = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '(the message)'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ConfigurationError(
                f"{where} {exc.title} from {type(data).__name__}: {fields}"
            ) from None
        except Exception as exc:  # a function of the data that failed (AttributeError, ...)
            raise ConfigurationError(f"{where}: {type(exc).__name__}: {exc}") from exc

    def validate(self, routes: dict[type[BaseModel], str] | None = None) -> None:
        """Raise :class:`ConfigurationError` listing every mistake in this definition."""
        problems: list[str] = []
        seen: set[str] = set()
        routes = routes or {}
        pivots = [s.name for s in self.steps if s.pivot]
        if not self.steps:
            problems.append("it has no steps")
        if len(pivots) > 1:
            problems.append(f"more than one pivot step: {pivots}")
        pivot = self.pivot_index
        for i, step in enumerate(self.steps):
            for part in step.parts():
                try:
                    validate_name(part.name, "step name")
                except ConfigurationError as exc:
                    problems.append(str(exc))
                if part.name in seen:
                    problems.append(f"duplicate step name {part.name!r}")
                seen.add(part.name)
            has_compensation = step.compensation is not None
            if pivot is not None and i > pivot and has_compensation:
                problems.append(
                    f"step {step.name!r} comes after the pivot {self.steps[pivot].name!r} "
                    "and so is never compensated; remove its compensation"
                )
            problems.extend(step.problems(self, i, routes))
        if problems:
            raise ConfigurationError(
                f"saga {self.name!r} v{self.version} is invalid:\n  - " + "\n  - ".join(problems)
            )

    def validate_migration(self, older: Saga[Any]) -> None:
        """Check that sagas of ``older`` can continue on this version under its rule."""
        rule = self.migration_from(older.version)
        if rule is None:
            return
        names = {part.name for step in self.steps for part in step.parts()}
        if rule.unless_passed not in names or older.find(rule.unless_passed) is None:
            raise ConfigurationError(
                f"saga {self.name!r} v{self.version}: migration guard step {rule.unless_passed!r} "
                f"must exist in v{older.version} and v{self.version}"
            )
        # the steps a saga that has not passed the guard may be at, a group's members included
        reachable = older.steps[: older.index(rule.unless_passed) + 1]
        missing = [p.name for s in reachable for p in s.parts() if p.name not in names]
        where = (
            f"saga {self.name!r} v{self.version} cannot take v{older.version} sagas that have "
            f"not passed {rule.unless_passed!r}"
        )
        if missing:
            raise ConfigurationError(f"{where}: it lacks their steps {missing}")
        regrouped = [change for s in reachable if (change := self._regrouped(s, older.version))]
        if regrouped:
            raise ConfigurationError(
                f"{where}: {'; '.join(regrouped)}; a saga there would go on without the rest "
                "of its group. Guard with a step before the change (unless_passed=), or keep "
                f"v{older.version} registered until its sagas finish"
            )

    def _regrouped(self, older: Step, version: int) -> str | None:
        """How the parallel group around ``older`` (a step of v``version``) differs here."""
        names = [part.name for part in older.parts()]
        here = self.steps[self.index(older.name)]
        ours = [part.name for part in here.parts()]
        if here.name == older.name and ours == names:
            return None
        if here.name != older.name:
            return f"step {older.name!r} of v{version} is a member of group {here.name!r} here"
        return f"group {older.name!r} has members {names[1:]} in v{version} but {ours[1:]} here"


def _key_of(event_key: str | KeyOf | None) -> KeyOf | None:
    """An ``event_key``: a field name becomes a function reading that field."""
    if isinstance(event_key, str):
        field_name = event_key
        return lambda event: getattr(event, field_name, None)
    return event_key
