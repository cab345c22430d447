"""What the dashboard's pages say must be true, over a real PostgreSQL through its ASGI
app: a held saga is not finished, a completed one shows no error banner, a hold is
drawn as a wait and not as the step's duration, a step's tries are counted truly, a
dry run warns of letters that will be rejected again, empty sections are not shown, and
a row its writer holds under a live lease is not shown as waiting in an outbox.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
from pydantic import BaseModel
from starlette.testclient import TestClient

from saga.dashboard.app import DashboardConfig, create_app
from saga.dashboard.databases import Databases, ServiceDatabase
from saga.dashboard.security import Guard
from saga.messaging.leases import Leases, leasing
from saga.messaging.outbox import Outbox
from tests.support.dashboard import TOKEN, dashboard_client, dead_letter
from tests.support.databases import DatabaseFactory, TestDatabase


@pytest.fixture
def dashboard(db: TestDatabase) -> Iterator[TestClient]:
    with dashboard_client(db, Guard(TOKEN)) as client:
        yield client


def _saga(
    db: TestDatabase,
    status: str,
    *,
    started: datetime,
    finished: datetime | None = None,
    last_error: str | None = None,
    step: str | None = None,
) -> uuid.UUID:
    saga_id = uuid.uuid4()
    db.execute(
        "INSERT INTO saga.saga_instances (id, name, saga_version, service, status, step, data, "
        "last_error, started_at, step_started_at, finished_at) "
        "VALUES (%s, 'order', 1, 'trips', %s, %s, '{}', %s, %s, %s, %s)",
        (saga_id, status, step, last_error, started, started, finished),
    )
    return saga_id


def _chart(page: str, canvas: str) -> dict[str, object]:
    found = re.search(rf"id=\"{canvas}\"[^>]*data-chart='([^']*)'", page)
    assert found, page
    data: dict[str, object] = json.loads(unescape(found.group(1)))
    return data


def _step_rows(page: str) -> list[list[str]]:
    """The text of each cell of each row of the steps table (attempts and waits)."""
    rows = re.findall(r'<tr class="(?:step[^"]*|wait)">(.*?)</tr>', page, re.S)
    return [
        [
            unescape(re.sub(r"<[^>]+>", "", cell)).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        ]
        for row in rows
    ]


def test_a_held_saga_is_not_counted_or_listed_as_finished(
    dashboard: TestClient, db: TestDatabase
) -> None:
    now = datetime.now(UTC)
    _saga(db, "completed", started=now - timedelta(seconds=2), finished=now)
    held = _saga(db, "step_dead_lettered", started=now - timedelta(seconds=2), finished=now)
    chart = _chart(dashboard.get("/").text, "activity")
    assert sum(chart["started"]) == 2  # type: ignore[call-overload]
    assert sum(chart["finished"]) == 1  # type: ignore[call-overload]
    listed = dashboard.get("/sagas?service=trips").text
    row = re.search(rf"{held}.*?</tr>", listed, re.S)
    assert row and "stopped" in row.group(0) and "not finished" in row.group(0), listed


def test_a_completed_saga_shows_its_old_error_without_a_red_banner(
    dashboard: TestClient, db: TestDatabase
) -> None:
    now = datetime.now(UTC)
    error = "charge_payment: dead-lettered after 9 attempts"
    done = _saga(db, "completed", started=now, finished=now, last_error=error)
    page = dashboard.get(f"/sagas/trips/{done}").text
    assert 'id="last-error"' not in page and 'class="problem"' not in page
    assert "completed after an earlier error" in page
    failed = _saga(db, "forward_failed", started=now, finished=now, last_error=error)
    assert 'id="last-error"' in dashboard.get(f"/sagas/trips/{failed}").text


def test_a_hold_is_drawn_as_a_wait_and_the_step_tries_are_counted_truly(
    dashboard: TestClient, db: TestDatabase
) -> None:
    """The step log of a saga held at charge_payment for 197.5 s, then replayed."""
    t0 = datetime.now(UTC) - timedelta(minutes=5)
    at = lambda ms: t0 + timedelta(milliseconds=ms)  # noqa: E731
    saga_id = _saga(db, "completed", started=t0, finished=at(197_600))
    charge = uuid.uuid4()
    steps = [
        ("reserve_credit", "succeeded", 10, 60, None, uuid.uuid4()),
        ("charge_payment", "failed", 70.8, 1200, "dead-lettered after 9 attempts", charge),
        ("charge_payment", "held", 1200, 1200, "held: replay the dead letter", charge),
        ("charge_payment", "succeeded", 70.8, 197_580, None, charge),
        ("approve_order", "succeeded", 197_580, 197_590, None, None),
    ]
    for step, outcome, start, end, error, message_id in steps:
        db.execute(
            "INSERT INTO saga.saga_steps (saga_id, step, phase, attempt, outcome, started_at, "
            "finished_at, error, message_id) VALUES (%s, %s, 'forward', 1, %s, %s, %s, %s, %s)",
            (saga_id, step, outcome, at(start), at(end), error, message_id),
        )
    db.execute(
        "INSERT INTO saga.dead_letters (consumer, reason, message_id, message_type, saga_id, "
        "body, error_type, error_message, attempts, status, replay_count, last_replayed_at, "
        "first_failed_at, last_failed_at) VALUES ('payments', 'failed', %s, 'ChargeCard', %s, "
        "'{}', 'HTTPError', '503', 9, 'replayed', 1, %s, %s, %s)",
        (charge, saga_id, at(197_500), at(100), at(1190)),
    )
    page = dashboard.get(f"/sagas/trips/{saga_id}").text
    charge_rows = [row for row in _step_rows(page) if row[1] == "charge_payment"]
    outcomes = [row[4] for row in charge_rows]
    assert outcomes == ["failed", "held", "held, waiting for an operator's replay", "succeeded"]
    failed, _held, wait, succeeded = charge_rows
    assert failed[3] == "9" and succeeded[3].startswith("10")  # 9 tries, then the replay
    assert wait[2] == "… wait" and wait[6] == "196,300.0"  # from the hold to the replay
    assert succeeded[5] == "197,500.0" and succeeded[6] == "80.0"  # the try after the replay
    commands = re.findall(r'<tr class="command">(.*?)</tr>', page, re.S)
    charged = [c for c in commands if str(charge) in c]
    assert len(charged) == 1 and "10 tries" in charged[0], commands
    chart = _chart(page, "timeline")
    bars = chart["bars"]
    assert chart["folded"] is True
    widths = [end - start for start, end in bars]  # type: ignore[attr-defined]
    wait_bar = widths[3]
    assert wait_bar < sum(widths) / 2  # the wait no longer dwarfs every step


def test_a_hold_ended_by_a_purge_is_drawn_as_a_wait_too(
    dashboard: TestClient, db: TestDatabase
) -> None:
    t0 = datetime.now(UTC) - timedelta(minutes=5)
    at = lambda ms: t0 + timedelta(milliseconds=ms)  # noqa: E731
    saga_id = _saga(db, "compensated", started=t0, finished=at(60_100))
    charge = uuid.uuid4()
    steps = [
        ("charge_payment", "forward", "failed", 10, 900, "dead-lettered after 4 attempts"),
        ("charge_payment", "forward", "held", 900, 900, "held: replay the dead letter"),
        ("charge_payment", "forward", "failed", 10, 60_000, "purged by an operator"),
    ]
    for step, phase, outcome, start, end, error in steps:
        db.execute(
            "INSERT INTO saga.saga_steps (saga_id, step, phase, attempt, outcome, started_at, "
            "finished_at, error, message_id) VALUES (%s, %s, %s, 1, %s, %s, %s, %s, %s)",
            (saga_id, step, phase, outcome, at(start), at(end), error, charge),
        )
    db.execute(
        "INSERT INTO saga.dead_letters (consumer, reason, message_id, message_type, saga_id, "
        "body, error_type, error_message, attempts, status, first_failed_at, last_failed_at) "
        "VALUES ('payments', 'failed', %s, 'ChargeCard', %s, '{}', 'HTTPError', '503', 4, "
        "'purged', %s, %s)",
        (charge, saga_id, at(100), at(890)),
    )
    rows = _step_rows(dashboard.get(f"/sagas/trips/{saga_id}").text)
    assert [(r[4], r[6]) for r in rows] == [
        ("failed", "890.0"),
        ("held", "0.0"),
        ("held, waiting for an operator", "59,100.0"),  # from the hold to the purge
        ("failed", "0.0"),
    ]
    assert [r[3] for r in rows] == ["4", "4", "", "4"]


def test_the_dry_run_warns_that_rejected_letters_will_be_rejected_again(
    dashboard: TestClient, db: TestDatabase
) -> None:
    for _ in range(2):
        dead_letter(db, reason="rejected")
    page = dashboard.get("/dead-letters/trips/replay?consumer=bank&reason=rejected").text
    warning = re.search(r'id="plan-warning">(.*?)</p>', page, re.S)
    assert warning and "2 of them were rejected before any handler ran" in warning.group(1)
    assert page.count("rejected again unless bank has changed") == 2
    failed = dead_letter(db)
    assert 'id="plan-warning"' not in dashboard.get(f"/dead-letters/trips/replay?ids={failed}").text


def test_empty_sections_are_not_shown(db: TestDatabase, database_factory: DatabaseFactory) -> None:
    quiet = database_factory.create()
    try:
        now = datetime.now(UTC)
        saga_id = _saga(db, "running", started=now, step="charge")
        databases = Databases(
            [ServiceDatabase("trips", db.url), ServiceDatabase("bank", quiet.url),
             ServiceDatabase("shop", quiet.url)]
        )  # fmt: skip
        with TestClient(create_app(DashboardConfig(databases, Guard(None)))) as client:
            overview = client.get("/").text
            page = client.get(f"/sagas/trips/{saga_id}").text
    finally:
        database_factory.drop(quiet.name)
    assert 'id="service-trips"' in overview and 'id="service-bank"' not in overview
    assert "no sagas in this database" not in overview
    found = re.search(r'id="quiet-services">(.*?)</p>', overview, re.S)
    assert found and "bank, shop" in found.group(1)
    assert "Waiting in an outbox" not in page


class LeaseLive(BaseModel):
    pass


class LeaseLapsed(BaseModel):
    pass


class HeldBack(BaseModel):
    pass


def test_a_row_under_a_live_lease_is_not_shown_as_waiting_in_an_outbox(
    db: TestDatabase, dashboard: TestClient
) -> None:
    """A consumer publishes the rows it leased right after its commit and deletes them a
    little later: until the lease ends such a row waits for nothing. A row whose lease
    lapsed waits for the relays, and a row held back waits for its time: both are shown."""
    saga_id = _saga(db, "running", started=datetime.now(UTC), step="charge")
    outbox = Outbox("saga")
    with db.connect() as conn:
        with leasing(Leases(timedelta(minutes=5))):
            outbox.add(conn, LeaseLive(), destination="bank", saga_id=saga_id)
        with leasing(Leases()):
            lapsed = outbox.add(conn, LeaseLapsed(), destination="bank", saga_id=saga_id)
        outbox.add(
            conn, HeldBack(), destination="bank", saga_id=saga_id, deliver_after=timedelta(hours=1)
        )
        conn.execute(  # the short lease has lapsed: the relays take the row now
            "UPDATE saga.outbox SET deliver_after = now() - interval '1 second' "
            "WHERE message_id = %s",
            (lapsed,),
        )
    page = dashboard.get(f"/sagas/trips/{saga_id}").text
    pending = re.search(r'<table id="pending">(.*?)</table>', page, re.S)
    assert pending, page
    assert "LeaseLapsed" in pending.group(1) and "HeldBack" in pending.group(1)
    assert "LeaseLive" not in pending.group(1)


def test_a_parallel_group_is_drawn_as_branches_and_listed_with_the_members_it_waits_on(
    dashboard: TestClient, db: TestDatabase
) -> None:
    t0 = datetime.now(UTC) - timedelta(seconds=5)
    at = lambda ms: t0 + timedelta(milliseconds=ms)  # noqa: E731
    saga_id = _saga(db, "running", started=t0, step="reserve")
    stock, credit, ship = (str(uuid.uuid4()) for _ in range(3))
    state = {
        "awaits": [stock, ship],
        "members": {
            "reserve_stock": {"message": stock, "attempt": 1},
            "reserve_credit": {"message": credit, "attempt": 1},
            "book_shipping": {"message": ship, "attempt": 1},
        },
    }
    db.execute(
        "UPDATE saga.saga_instances SET step_state = %s WHERE id = %s",
        (json.dumps(state), saga_id),
    )
    shape = [
        {"step": "open", "kind": "local", "pivot": False, "compensated": True},
        {
            "step": "reserve",
            "kind": "parallel",
            "pivot": False,
            "compensated": False,
            "members": [{"step": m, "kind": "remote"} for m in state["members"]],
        },
    ]
    db.execute(
        "INSERT INTO saga.saga_definitions (name, version, fingerprint, steps) "
        "VALUES ('order', 1, 'f', %s)",
        (json.dumps(shape),),
    )
    for step, start, end in [("open", 0, 5), ("reserve_credit", 6, 40)]:
        db.execute(
            "INSERT INTO saga.saga_steps (saga_id, step, phase, attempt, outcome, started_at, "
            "finished_at) VALUES (%s, %s, 'forward', 1, 'succeeded', %s, %s)",
            (saga_id, step, at(start), at(end)),
        )

    page = dashboard.get(f"/sagas/trips/{saga_id}").text
    assert re.search(r'id="waiting-on">reserve_stock, book_shipping<', page), page
    groups = re.findall(r'<tr class="group">(.*?)</tr>', page, re.S)
    assert len(groups) == 1 and "reserve" in groups[0]
    branch_rows = re.findall(r'<tr class="step branch[^"]*">(.*?)</tr>', page, re.S)
    assert len(branch_rows) == 1 and "reserve_credit" in branch_rows[0]
    labels = _chart(page, "timeline")["labels"]
    assert labels[:2] == [  # the current wait names the members still out
        "1. → open (try 1, succeeded)",
        "2. → reserve ┃ reserve_credit (try 1, succeeded)",
    ]
    assert "waiting for reserve_stock, book_shipping" in labels[2]  # type: ignore[index]
    listed = dashboard.get("/sagas?service=trips").text
    row = re.search(rf"{saga_id}.*?</tr>", listed, re.S)
    assert (
        row
        and 'reserve: <span class="waiting-on">reserve_stock, book_shipping</span>' in row.group(0)
    )
