"""Exploring a saga under schedules of failures: Hypothesis chooses what befalls each message.

One run starts the saga in a fresh harness and, for each message the first time
it is bound for a service, draws what happens to it: it is delivered; its step
fails (a business failure, or a dead letter after every try); it is delivered
twice; it comes late, after everything else has settled; or the saga is
cancelled while it is on its way. Time skips by itself in between. Once the
run settles, the user's invariant is checked on the user's tables. Hypothesis
shrinks a failing schedule to the shortest, and the failure carries the
harness test that replays it, each choice written as the harness call that
makes it happen (``fail_transiently``, ``on(..., Fail(...))``,
``crash_after_commit(..., nth=)``, ``hold(..., nth=)`` and ``release``,
``cancel``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pydantic import BaseModel

from saga.engine.definition import Saga
from saga.errors import HarnessSetupError, NotCancellable, StepFailed
from saga.messaging.control import DEAD_LETTERED
from saga.messaging.envelope import COMPENSATES_HEADER, STEP_HEADER
from saga.testing.messages import Message
from saga.testing.stubs import Fail

if TYPE_CHECKING:
    from saga.testing.harness import SagaHarness

#: How many schedules ``explore`` tries unless told otherwise.
DEFAULT_BUDGET = 200
#: Tries of a handler made to fail every time: more than any retry policy makes.
EVERY_TRY = 1_000_000

DELIVER = "delivered"
FAIL = "fails"
DEAD_LETTER = "dead-lettered"
DUPLICATE = "delivered twice"
LATE = "late"
CANCEL = "cancel while on its way"

#: A function of the choices offered and a label, returning the one taken.
Draw = Callable[[list[str], str], str]
Invariant = Callable[["SagaHarness", UUID], object]


@dataclass(frozen=True, slots=True)
class Choice:
    """What befell the ``nth`` ``type_name`` bound for ``service``."""

    kind: str
    service: str
    type_name: str
    nth: int
    stubbed: bool


class ScheduleRun:
    """One run of a saga in ``harness``, each message's fate taken from ``draw``."""

    def __init__(self, harness: SagaHarness, draw: Draw) -> None:
        self.harness = harness
        self.draw = draw
        self.choices: list[Choice] = []
        self.steps: list[str] = []
        self._seen: set[UUID] = set()
        self._cancel_before: set[UUID] = set()
        self._home = harness.registry.service_name if harness.registry is not None else None

    def play(self, saga: Saga[Any], data: BaseModel, invariant: Invariant) -> None:
        """Start the saga, run it until it settles (late messages last), check ``invariant``."""
        h = self.harness
        h._on_delivery = self._choose
        saga_id = h.start(saga, data)
        self.steps.append(f"saga_id = h.start({saga.name}, {data!r})")
        while True:
            h.run_until_idle(skip_time=True)
            self.steps.append("h.run_until_idle(skip_time=True)")
            if not h.held:
                break
            message = h.held[0]
            if message.envelope.message_id in self._cancel_before:
                self._cancel(saga_id)
            h._release(message.service, message.type)
            self.steps.append(f"h.release({message.service!r}, {message.type})")
        if invariant(h, saga_id) is False:
            raise AssertionError(f"{_name(invariant)} returned False")

    def as_test(self, invariant: Invariant) -> str:
        """The run as a harness test to paste, ``h`` made as the explored harness was."""
        setup = [_setup_line(c) for c in self.choices if c.kind != DELIVER]
        check = f"assert {_name(invariant)}(h, saga_id) is not False"
        body = ["h.fail_fast = False", *setup, *self.steps, check]
        chosen = "\n".join(
            f"#   {c.service} {c.type_name} #{c.nth}: {c.kind}" for c in self.choices
        )
        return (
            "explore: this schedule breaks the invariant:\n"
            f"{chosen}\n"
            "As a harness test (h made and seeded as the harness explore was called on; "
            "StepFailed from saga, Fail from saga.testing):\n\n"
            "def test_explored_schedule(h: SagaHarness) -> None:\n"
            + "\n".join(f"    {line}" for line in body)
        )

    # -- choosing ---------------------------------------------------------------------

    def _choose(self, message: Message, nth: int) -> None:
        if message.envelope.message_id in self._seen:
            return  # a retry or a deadline's resend: its fate was drawn the first time
        self._seen.add(message.envelope.message_id)
        service, type_name = message.service, message.type
        options = [DELIVER]
        if self._is_step_command(message) and nth == 1:
            options += [FAIL, DEAD_LETTER]
        stubbed = service not in self.harness.services
        if not stubbed:
            options.append(DUPLICATE)
        options += [LATE, CANCEL]
        kind = self.draw(options, f"{service} {type_name} #{nth}")
        self.choices.append(Choice(kind, service, type_name, nth, stubbed))
        self._apply(kind, message, nth)

    def _is_step_command(self, message: Message) -> bool:
        headers = message.envelope.headers
        return (
            message.destination != self._home
            and STEP_HEADER in headers
            and COMPENSATES_HEADER not in headers
        )

    def _apply(self, kind: str, message: Message, nth: int) -> None:
        h, key = self.harness, (message.service, message.type)
        real = message.service in h.services
        if kind == FAIL and real:
            h._inject(key, StepFailed("explored failure"), 1)
        elif kind == FAIL:
            h.stubs.add_rule(*key, Fail("explored failure"))
        elif kind == DEAD_LETTER and real:
            h._inject(key, ConnectionError("explored: fails at every try"), EVERY_TRY)
        elif kind == DEAD_LETTER:
            h.stubs.add_rule(*key, Fail("explored dead letter", code=DEAD_LETTERED))
        elif kind == DUPLICATE:
            h._plan(h._crashes, key, 1, nth)
        elif kind in (LATE, CANCEL):
            h._plan(h._holds, key, 1, nth)
            if kind == CANCEL:
                self._cancel_before.add(message.envelope.message_id)

    def _cancel(self, saga_id: UUID) -> None:
        try:
            self.harness.cancel(saga_id, "cancelled by explore")
        except NotCancellable:
            self.steps.append("# a cancel here is refused (NotCancellable): nothing changes")
            return
        self.steps.append('h.cancel(saga_id, "cancelled by explore")')


def explore(
    make_harness: Callable[[], SagaHarness],
    saga: Saga[Any],
    data: BaseModel,
    invariant: Invariant,
    *,
    setup: Callable[[SagaHarness], object] | None = None,
    max_examples: int = DEFAULT_BUDGET,
) -> None:
    """Run ``saga`` on ``data`` under up to ``max_examples`` schedules of failures, each in
    a harness from ``make_harness`` seeded by ``setup``; raise the shortest schedule that
    breaks ``invariant`` (an exception, or False), with the test that replays it."""
    try:
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import strategies as st
    except ImportError:
        raise HarnessSetupError(
            "explore needs Hypothesis: pip install 'saga-outbox[testing]'"
        ) from None

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),  # no example database to reuse
    )
    @given(st.data())
    def schedules(drawn: st.DataObject) -> None:
        harness = make_harness()
        try:
            if setup is not None:
                setup(harness)
            run = ScheduleRun(
                harness, lambda options, label: drawn.draw(st.sampled_from(options), label=label)
            )
            try:
                run.play(saga, data, invariant)
            except Exception as exc:
                exc.add_note(run.as_test(invariant))
                raise
        finally:
            harness.close()

    schedules()


def _setup_line(choice: Choice) -> str:
    where = f"{choice.service!r}, {choice.type_name}"
    if choice.kind == FAIL and choice.stubbed:
        return f'h.on({where}, Fail("explored failure"))'
    if choice.kind == DEAD_LETTER and choice.stubbed:
        return f'h.on({where}, Fail("explored dead letter", code="{DEAD_LETTERED}"))'
    if choice.kind == FAIL:
        return f'h.fail_transiently({where}, times=1, error=StepFailed("explored failure"))'
    if choice.kind == DEAD_LETTER:
        return f"h.fail_transiently({where}, times={EVERY_TRY:_})  # every try: a dead letter"
    if choice.kind == DUPLICATE:
        return f"h.crash_after_commit({where}, nth={choice.nth})"
    return f"h.hold({where}, nth={choice.nth})  # {choice.kind}"


def _name(function: Callable[..., object]) -> str:
    return getattr(function, "__name__", "invariant")
