"""A batch shares one savepoint per segment of deliveries while no handler fails.

Through :class:`DeliveryBatchProcessor` on a real PostgreSQL: the savepoint commands a batch
sends are counted, and a handler that fails in the middle of a segment must leave
every other delivery's effect exactly once and its own writes undone. Deliveries that all
concern one saga take no savepoint at all.
"""

from __future__ import annotations

from collections import Counter
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from pydantic import BaseModel

from saga import HandlerContext, RetryPolicy, Service, StepFailed
from saga.consumers import Delivery, DeliveryBatchProcessor, DeliveryOutcome
from saga.consumers.delivery_batches import SEGMENT
from saga.messaging.envelope import Envelope
from saga.observability import tracing
from tests.support.databases import TestDatabase
from tests.support.services import EFFECTS_DDL

JSON = "application/json"


class Write(BaseModel):
    key: str
    fail: str = ""  # "business", "technical" or "sql": how its handler fails after writing


runs: Counter[str] = Counter()
segmented = Service("segmented", retry=RetryPolicy(immediate_attempts=1, delays=(60,)))


@segmented.handler(Write)
def write(tx: psycopg.Connection[Any], msg: Write, ctx: HandlerContext) -> None:
    runs[msg.key] += 1
    tx.execute("INSERT INTO public.effects (kind, key) VALUES ('write', %s)", (msg.key,))
    if msg.fail == "business":
        raise StepFailed(f"refusing {msg.key}")
    if msg.fail == "technical":
        raise RuntimeError(f"{msg.key} failed")
    if msg.fail == "sql":
        tx.execute("SELECT no_such_column FROM public.effects")


class SavepointCounter(psycopg.Cursor[Any]):
    """Counts the SAVEPOINT commands sent through cursors (``conn.execute`` included)."""

    sent = 0

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(query, str) and query.startswith("SAVEPOINT"):
            SavepointCounter.sent += 1
        return super().execute(query, *args, **kwargs)


@pytest.fixture(autouse=True)
def _no_spans_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a process with no OpenTelemetry SDK (another test may have configured one)."""
    monkeypatch.setattr(tracing, "records_spans", lambda: False)


def _process(
    db: TestDatabase, messages: list[Write], saga_id: UUID | None = None
) -> tuple[list[DeliveryOutcome], int]:
    db.execute(EFFECTS_DDL)
    runs.clear()
    deliveries = [Delivery(Envelope.wrap(m, saga_id=saga_id).to_bytes(), JSON) for m in messages]
    with psycopg.connect(db.url, cursor_factory=SavepointCounter) as conn:
        SavepointCounter.sent = 0
        outcomes = DeliveryBatchProcessor(segmented).process(conn, deliveries)
        return outcomes, SavepointCounter.sent


def _written(db: TestDatabase) -> Counter[str]:
    return Counter(key for (key,) in db.rows("SELECT key FROM public.effects"))


def test_a_batch_that_does_not_fail_takes_one_savepoint_per_segment(db: TestDatabase) -> None:
    messages = [Write(key=f"w{i}") for i in range(2 * SEGMENT + 3)]
    outcomes, savepoints = _process(db, messages)
    assert outcomes == [DeliveryOutcome.HANDLED] * len(messages)
    assert savepoints == 3  # two full segments and the rest
    assert _written(db) == Counter(m.key for m in messages)
    assert set(runs.values()) == {1}


def test_a_failing_handler_reruns_only_the_start_of_its_segment(db: TestDatabase) -> None:
    # The second segment fails at its 5th delivery (a business failure); the next segment
    # starts right after it, and the one after that fails at its 6th (an SQL error).
    messages = [Write(key=f"w{i}") for i in range(3 * SEGMENT)]
    business = SEGMENT + 4
    sql = business + 1 + SEGMENT + 5
    messages[business] = Write(key="refused", fail="business")
    messages[sql] = Write(key="broken", fail="sql")
    outcomes, savepoints = _process(db, messages)

    expected = [DeliveryOutcome.HANDLED] * len(messages)
    expected[business] = DeliveryOutcome.BUSINESS_FAILURE
    expected[sql] = DeliveryOutcome.DEAD_LETTERED  # a ProgrammingError: no retry can mend it
    assert outcomes == expected
    ok = [m.key for m in messages if not m.fail]
    assert _written(db) == Counter(ok)  # every other write once; the failed ones undone
    rerun = messages[SEGMENT:business] + messages[business + 1 + SEGMENT : sql]
    assert {key for key, n in runs.items() if n == 2} == {m.key for m in rerun}
    assert runs["refused"] == runs["broken"] == 1  # a failed first try is not run again
    # One per segment (five of them), and one for each delivery run again with care.
    assert savepoints == 5 + len(rerun)


def test_a_technical_failure_in_a_segment_is_retried_later_alone(db: TestDatabase) -> None:
    messages = [Write(key=f"w{i}") for i in range(5)]
    messages[2] = Write(key="flaky", fail="technical")
    outcomes, _ = _process(db, messages)
    assert outcomes[2] is DeliveryOutcome.RETRY_SCHEDULED
    assert outcomes[:2] + outcomes[3:] == [DeliveryOutcome.HANDLED] * 4
    assert _written(db) == Counter(["w0", "w1", "w3", "w4"])
    assert runs["flaky"] == 1  # immediate_attempts=1: its one try was the segment's
    retry = db.scalar(
        "SELECT count(*) FROM saga.outbox WHERE destination = 'segmented' AND deliver_after > now()"
    )
    assert retry == 1


def test_where_spans_are_recorded_every_delivery_has_its_own_savepoint(
    db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing, "records_spans", lambda: True)
    messages = [Write(key=f"w{i}") for i in range(SEGMENT + 2)]
    messages[3] = Write(key="refused", fail="business")
    outcomes, savepoints = _process(db, messages)
    assert outcomes.count(DeliveryOutcome.HANDLED) == len(messages) - 1
    assert savepoints == len(messages)
    assert set(runs.values()) == {1}  # no handler ran twice


def test_deliveries_for_one_saga_take_no_savepoint(db: TestDatabase) -> None:
    """A parallel group's replies (or a fan-out's items) handled together: like a lone
    delivery, no savepoint and no lock timeout; one saga's rows are all they touch."""
    messages = [Write(key=f"w{i}") for i in range(3)]
    outcomes, savepoints = _process(db, messages, saga_id=uuid4())
    assert outcomes == [DeliveryOutcome.HANDLED] * 3
    assert savepoints == 0
    assert _written(db) == Counter(m.key for m in messages)
    assert set(runs.values()) == {1}


def test_a_failure_among_deliveries_for_one_saga_reruns_those_before_it_with_care(
    db: TestDatabase,
) -> None:
    messages = [Write(key=f"w{i}") for i in range(5)]
    messages[2] = Write(key="refused", fail="business")
    outcomes, savepoints = _process(db, messages, saga_id=uuid4())
    expected = [DeliveryOutcome.HANDLED] * 5
    expected[2] = DeliveryOutcome.BUSINESS_FAILURE
    assert outcomes == expected
    assert _written(db) == Counter(["w0", "w1", "w3", "w4"])  # the refused write undone
    # The first try had no savepoint: all of it rolled back; the two before the failure
    # ran again, each in a savepoint, and the rest in a segment.
    assert runs == Counter({"w0": 2, "w1": 2, "refused": 1, "w3": 1, "w4": 1})
    assert savepoints == 2 + 1
