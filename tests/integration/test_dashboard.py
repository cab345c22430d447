"""The dashboard's pages and actions over a real PostgreSQL, through its ASGI app.

Every action (replay, purge, cancel, resume) is refused, changing nothing, without a
signed-in session, without the form's CSRF token, and on a read-only dashboard.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from starlette.testclient import TestClient

from saga.dashboard.app import DashboardConfig, create_app
from saga.dashboard.databases import Databases, ServiceDatabase
from saga.dashboard.security import SESSION_COOKIE, Guard
from saga.engine.state import SagaRecord
from saga.engine.store import SagaStore
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.dashboard import (
    TOKEN,
    dashboard_client,
    dead_letter,
    sign_in,
    start_trip,
    state,
)
from tests.support.databases import TestDatabase


@pytest.fixture
def dashboard(db: TestDatabase) -> Iterator[TestClient]:
    with dashboard_client(db, Guard(TOKEN)) as client:
        yield client


@pytest.fixture
def read_only(db: TestDatabase) -> Iterator[TestClient]:
    with dashboard_client(db, Guard(None)) as client:
        yield client


def _action_paths(db: TestDatabase) -> dict[str, tuple[str, dict[str, str]]]:
    saga_id = start_trip(db, "t-actions")
    letter = dead_letter(db)
    return {
        "replay": ("/dead-letters/trips/replay", {"ids": str(letter)}),
        "replay a group": ("/dead-letters/trips/replay", {"consumer": "bank"}),
        "purge": ("/dead-letters/trips/purge", {"ids": str(letter), "confirm": "purge"}),
        "cancel": (f"/sagas/trips/{saga_id}/cancel", {}),
        "resume": (f"/sagas/trips/{saga_id}/resume", {}),
    }


ACTIONS = ["replay", "replay a group", "purge", "cancel", "resume"]


@pytest.mark.parametrize("action", ACTIONS)
def test_an_action_without_a_session_changes_nothing(
    dashboard: TestClient, db: TestDatabase, action: str
) -> None:
    path, form = _action_paths(db)[action]
    before = state(db)
    csrf = "A" * 43  # the shape of a CSRF token, without the session it belongs to
    for data in ({**form}, {**form, "csrf": csrf}, {**form, "token": TOKEN}):
        response = dashboard.post(path, data=data)
        assert response.status_code == 403 and "sign in" in response.text, response.text
    dashboard.cookies.set(SESSION_COOKIE, "mallory|" + "0" * 64)  # a forged session
    response = dashboard.post(path, data={**form, "csrf": csrf})
    assert response.status_code == 403
    assert state(db) == before


@pytest.mark.parametrize("action", ACTIONS)
def test_an_action_without_the_csrf_token_is_refused(
    dashboard: TestClient, db: TestDatabase, action: str
) -> None:
    path, form = _action_paths(db)[action]
    csrf = sign_in(dashboard)
    before = state(db)
    for data in (
        {**form},
        {**form, "csrf": ""},
        {**form, "csrf": csrf[:-1] + ("1" if csrf[-1] != "1" else "2")},  # one character off
    ):
        response = dashboard.post(path, data=data)
        assert response.status_code == 403 and "CSRF" in response.text, response.text
    assert state(db) == before


@pytest.mark.parametrize("action", ACTIONS)
def test_a_read_only_dashboard_says_so_and_refuses_every_action(
    read_only: TestClient, db: TestDatabase, action: str
) -> None:
    path, form = _action_paths(db)[action]
    assert 'id="read-only"' in read_only.get("/").text
    before = state(db)
    response = read_only.post(path, data={**form, "csrf": "x", "token": TOKEN})
    assert response.status_code == 403 and "read-only" in response.text
    assert read_only.post("/login", data={"token": TOKEN, "operator": "ada"}).status_code == 303
    assert "read-only" in read_only.get("/login").text  # said once, from the session
    response = read_only.post(path, data={**form, "csrf": "x"})
    assert response.status_code == 403 and "read-only" in response.text
    assert state(db) == before


def test_signed_in_actions_take_effect_and_are_recorded(
    dashboard: TestClient, db: TestDatabase
) -> None:
    to_cancel, to_resume = start_trip(db, "t-cancel"), start_trip(db, "t-resume")
    replayed, purged = dead_letter(db), dead_letter(db)
    csrf = sign_in(dashboard, "ada lovelace")
    preview = dashboard.get(f"/dead-letters/trips/replay?ids={replayed}").text
    assert "1 of 1 dead letter(s) in trips would be replayed" in preview
    assert db.scalar("SELECT status FROM saga.dead_letters WHERE id = %s", (replayed,)) == (
        "pending"
    )
    posts = [
        ("/dead-letters/trips/replay", {"ids": str(replayed)}, "replayed 1 dead letter"),
        ("/dead-letters/trips/purge", {"ids": str(purged), "confirm": "purge"}, "purged 1"),
        (f"/sagas/trips/{to_cancel}/cancel", {}, "will compensate"),
        (f"/sagas/trips/{to_resume}/resume", {}, "resume of saga"),
    ]
    for path, form, outcome in posts:
        response = dashboard.post(path, data={**form, "csrf": csrf})
        assert response.status_code == 303, response.text
        assert outcome in dashboard.get(response.headers["location"]).text
    letters = dict(db.rows("SELECT id, status FROM saga.dead_letters"))
    assert letters == {replayed: "replayed", purged: "purged"}
    assert db.scalar("SELECT cancel_requested FROM saga.saga_instances WHERE id = %s", (to_cancel,))
    resumes = "SELECT count(*) FROM saga.outbox WHERE message_type = 'saga.ResumeSaga'"
    assert db.scalar(resumes) == 1
    recorded = db.rows(
        "SELECT operator, client, action, target->>'service', result "
        "FROM saga.dashboard_actions ORDER BY id"
    )
    assert [(r[0], r[2], r[3]) for r in recorded] == [
        ("ada lovelace", action, "trips") for action in ("replay", "purge", "cancel", "resume")
    ]
    assert all(r[1] for r in recorded) and "replayed 1" in recorded[0][4]
    assert "ada lovelace" in dashboard.get("/actions").text


def test_pages_mask_sensitive_fields_as_the_cli_does(
    dashboard: TestClient, db: TestDatabase
) -> None:
    saga_id = uuid.uuid4()
    data = {"order": "o-1", "email": "ada@example.com", "card": {"card_number": "4111111111"}}
    with db.connect() as conn:
        record = SagaRecord.new(saga_id, "checkout", 1, "trips", data)
        SagaStore("saga").insert_step(conn, record, None, [], None)
    letter = dead_letter(db, {"key": "k", "password": "hunter2", "iban": "DE89370400440532"})
    page = dashboard.get(f"/sagas/trips/{saga_id}").text
    assert "o-1" in page and "ada@example.com" not in page and "4111111111" not in page
    shown = dashboard.get(f"/dead-letters/trips/{letter}").text
    assert "hunter2" not in shown and "DE89370400440532" not in shown and "***" in shown
    assert "Traceback: gateway.py line 7" in shown and "GatewayTimeout" in shown


def test_the_list_filters_and_pages_through_every_saga_once(
    dashboard: TestClient, db: TestDatabase
) -> None:
    db.execute(
        "INSERT INTO saga.saga_instances (id, name, saga_version, service, status, data, "
        "started_at) SELECT gen_random_uuid(), CASE WHEN i %% 3 = 0 THEN 'refund' ELSE 'order' "
        "END, 1, 'trips', CASE WHEN i %% 10 = 0 THEN 'compensated' ELSE 'completed' END, "
        "jsonb_build_object('customer', 'c-' || i), now() - make_interval(secs => i / 3) "
        "FROM generate_series(1, 130) AS i"
    )
    seen: list[str] = []
    url: str | None = "/sagas?service=trips"
    while url:
        page = dashboard.get(url).text
        seen += re.findall(r'class="saga-link" href="/sagas/trips/([0-9a-f-]{36})"', page)
        found = re.search(r'id="next-page" href="([^"]+)"', page)
        url = found.group(1).replace("&amp;", "&") if found else None
    assert len(seen) == 130 == len(set(seen))  # three pages, none twice, none missed
    compensated = dashboard.get("/sagas?service=trips&status=compensated").text
    assert compensated.count('class="saga-row"') == 13
    by_text = dashboard.get("/sagas?service=trips&text=c-42").text
    assert by_text.count('class="saga-row"') == 1
    wildcard = dashboard.get("/sagas?service=trips&text=c_4%25").text  # _ and % are literal
    assert 'class="saga-row"' not in wildcard
    by_name = dashboard.get("/sagas?service=trips&name=refund&status=compensated").text
    assert by_name.count('class="saga-row"') == 4  # i = 30, 60, 90, 120
    one = seen[7]
    assert dashboard.get(f"/sagas?service=trips&id={one}").text.count('class="saga-row"') == 1
    bad = dashboard.get("/sagas?service=trips&status=lost").text
    assert "unknown status" in bad


def test_overview_and_dead_letter_groups(dashboard: TestClient, db: TestDatabase) -> None:
    start_trip(db, "t-overview")
    for _ in range(3):
        dead_letter(db)
    overview = dashboard.get("/").text
    assert "book_trip" in overview and 'class="status running"' in overview
    assert "data-chart=" in overview and "chart.umd.min.js" in overview
    groups = dashboard.get("/dead-letters").text
    assert re.search(r'GatewayTimeout</td>\s*<td class="num">3</td>', groups), groups
    assert dashboard.get("/static/chart.umd.min.js").status_code == 200
    missing = dashboard.get(f"/sagas/trips/{uuid.uuid4()}").text
    assert "no saga" in missing


def test_the_overview_shows_the_transaction_holding_back_vacuum(
    dashboard: TestClient, db: TestDatabase
) -> None:
    with psycopg.connect(db.url, application_name="nightly-report") as held:
        held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        held.execute("SELECT 1")
        overview = dashboard.get("/").text
        held.rollback()
    assert "Oldest open transaction" in overview and "nightly-report" in overview, overview
    assert "idle in transaction" in overview and f"{db.schema}.outbox" in overview
    # released: nothing is held, and a database with nothing else to say is listed as quiet
    assert "nightly-report" not in dashboard.get("/").text


def test_the_command_refuses_a_bad_database_list_clearly(db: TestDatabase) -> None:
    bad = saga_cli(db.url, "dashboard", "--db", "orders=not-a-url")
    assert bad.returncode == 2 and "is not SERVICE=URL" in bad.stderr, bad.stderr
    twice = saga_cli(db.url, "dashboard", "--db", f"a={db.url}", "--db", f"a={db.url}")
    assert twice.returncode == 2 and "two databases" in twice.stderr, twice.stderr
    none = saga_cli("", "dashboard")
    assert none.returncode == 2 and "no database" in none.stderr, none.stderr


def test_the_overview_shows_how_many_messages_wait_in_each_queue(
    db: TestDatabase, any_broker: TestBroker
) -> None:
    any_broker.publish_many("trips", [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}'])
    databases = Databases([ServiceDatabase("trips", db.url), ServiceDatabase("bank", db.url)])
    config = DashboardConfig(databases, Guard(None), any_broker.config, any_broker.topology)
    with TestClient(create_app(config)) as client:
        page = client.get("/").text
    queues = page.split('id="queues"')[1]
    queue = re.escape(any_broker.topology.queue_name("trips"))
    assert re.search(queue + r'</td><td class="num">3</td>', queues), queues
    assert "problem" not in queues
    assert any_broker.topology.queue_name("bank") not in queues  # no queue: not invented
