"""A small saga for orchestration tests: a trip that charges, books and notifies.

``trips`` is the home service; ``bank`` the participant. Both use the test's
one database (different consumers, one inbox table). Failures are requested
through the saga data so each test picks its own path.
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel

from saga import HandlerContext, RetryPolicy, Saga, SagaRegistry, Service, StepFailed, StepRetry, Tx
from tests.support.services import EFFECTS_DDL

__all__ = ["EFFECTS_DDL", "TripData", "bank", "registry", "trip"]


class TripData(BaseModel):
    trip_id: str
    amount: int = 100
    refund_failures: int = 0
    book_fails: bool = False
    notify_failures: int = 0
    vip: bool = False
    charge_id: str | None = None


class Charge(BaseModel):
    trip_id: str
    amount: int


class Charged(BaseModel):
    charge_id: str


class Refund(BaseModel):
    charge_id: str
    failures: int


class Book(BaseModel):
    trip_id: str
    fail: bool


class Notify(BaseModel):
    trip_id: str
    failures: int


class Upgrade(BaseModel):
    trip_id: str


def effect(tx: Tx, kind: str, key: str) -> None:
    tx.execute("INSERT INTO public.effects (kind, key) VALUES (%s, %s)", (kind, key))


trip = Saga(
    "book_trip",
    data=TripData,
    retry=StepRetry(attempts=5, initial_delay=0.05, max_delay=0.2),
)


@trip.local("open_trip", compensate="close_trip")
def open_trip(tx: Tx, d: TripData) -> None:
    effect(tx, "open", d.trip_id)


@trip.local_compensation("close_trip")
def close_trip(tx: Tx, d: TripData) -> None:
    effect(tx, "close", d.trip_id)


trip.remote(
    "charge",
    service="bank",
    command=Charge,
    reply=Charged,
    on_reply=lambda d, r: d.model_copy(update={"charge_id": r.charge_id}),
    compensate=lambda d: Refund(charge_id=d.charge_id, failures=d.refund_failures),
)
trip.remote("upgrade", service="bank", command=Upgrade, when=lambda d: d.vip)
trip.remote(
    "book_hotel",
    service="bank",
    command=lambda d: Book(trip_id=d.trip_id, fail=d.book_fails),
    pivot=True,
)
trip.remote(
    "notify",
    service="bank",
    command=lambda d: Notify(trip_id=d.trip_id, failures=d.notify_failures),
)


@trip.local("confirm")
def confirm(tx: Tx, d: TripData) -> None:
    effect(tx, "confirm", d.trip_id)


FAST = RetryPolicy(immediate_attempts=2, immediate_initial_wait=0.0, delays=(0.05,))
registry = SagaRegistry("trips", retry=FAST)
registry.register(trip)

bank = Service("bank", retry=FAST)
_tries: Counter[str] = Counter()
#: Charges whose refund works again ("the operator fixed the cause").
FIXED_REFUNDS: set[str] = set()


def reset_counters() -> None:
    """Forget tries and fixed refunds (an autouse fixture calls it before every test)."""
    _tries.clear()
    FIXED_REFUNDS.clear()


@bank.handler(Charge)
def charge(tx: Tx, cmd: Charge, ctx: HandlerContext) -> Charged:
    effect(tx, "charge", cmd.trip_id)
    return Charged(charge_id=f"ch-{cmd.trip_id}")


@bank.handler(Refund)
def refund(tx: Tx, cmd: Refund, ctx: HandlerContext) -> None:
    _tries[f"refund:{cmd.charge_id}"] += 1
    fixed = cmd.charge_id in FIXED_REFUNDS
    if not fixed and _tries[f"refund:{cmd.charge_id}"] <= cmd.failures:
        raise StepFailed(f"refund refused ({_tries[f'refund:{cmd.charge_id}']})")
    effect(tx, "refund", cmd.charge_id)


@bank.handler(Upgrade)
def upgrade(tx: Tx, cmd: Upgrade, ctx: HandlerContext) -> None:
    effect(tx, "upgrade", cmd.trip_id)


@bank.handler(Book)
def book(tx: Tx, cmd: Book, ctx: HandlerContext) -> None:
    if cmd.fail:
        raise StepFailed("no rooms")
    effect(tx, "book", cmd.trip_id)


@bank.handler(Notify)
def notify(tx: Tx, cmd: Notify, ctx: HandlerContext) -> None:
    _tries[f"notify:{cmd.trip_id}"] += 1
    if _tries[f"notify:{cmd.trip_id}"] <= cmd.failures:
        raise StepFailed("mail server says no")
    effect(tx, "notify", cmd.trip_id)
