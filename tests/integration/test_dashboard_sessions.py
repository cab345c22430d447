"""Who may act from the dashboard, over a real PostgreSQL through its ASGI app: sign-in
sessions that sign-out, idleness and a new token end; CSRF tokens bound to their
session; non-ASCII tokens refused like any other bad token; a purge that needs its
confirmation; messages that only the server can put on a page; security headers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html import unescape
from urllib.parse import quote

import pytest
from starlette.testclient import TestClient

from saga.dashboard.headers import SECURITY_HEADERS
from saga.dashboard.security import SESSION_COOKIE, Guard
from saga.dashboard.sessions import SessionStore
from tests.support.dashboard import (
    TOKEN,
    dashboard_client,
    dead_letter,
    sign_in,
    start_trip,
    state,
)
from tests.support.databases import TestDatabase


class FakeClock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def dashboard(db: TestDatabase) -> Iterator[TestClient]:
    with dashboard_client(db, Guard(TOKEN)) as client:
        yield client


def _replay(client: TestClient, letter: int, csrf: str) -> int:
    response = client.post("/dead-letters/trips/replay", data={"ids": str(letter), "csrf": csrf})
    return response.status_code


def test_non_ascii_csrf_tokens_and_cookies_are_refused_with_403(
    dashboard: TestClient, db: TestDatabase
) -> None:
    letter = dead_letter(db)
    start_trip(db, "t-1")
    csrf = sign_in(dashboard)
    cookie = dashboard.cookies[SESSION_COOKIE]
    before = state(db)
    for bad in ("é", "é" * len(csrf), csrf[:-1] + "é"):
        assert _replay(dashboard, letter, bad) == 403
    dashboard.cookies.clear()
    for bad_cookie in (cookie[:-1] + "é", "mallory|" + "é" * 64, "é"):
        response = dashboard.post(
            "/dead-letters/trips/replay",
            data={"ids": str(letter), "csrf": csrf},
            headers={"cookie": f"{SESSION_COOKIE}={bad_cookie}".encode()},
        )
        assert response.status_code == 403 and "sign in" in response.text, response.text
    assert state(db) == before


def test_after_signing_out_the_old_cookie_can_do_nothing(
    dashboard: TestClient, db: TestDatabase
) -> None:
    letter = dead_letter(db)
    start_trip(db, "t-1")
    csrf = sign_in(dashboard, "mallory")
    old_cookie = dashboard.cookies[SESSION_COOKIE]
    assert dashboard.post("/logout").status_code == 303
    dashboard.cookies.set(SESSION_COOKIE, old_cookie)  # kept by whoever stole it
    assert "signed in as" not in dashboard.get("/").text
    before = state(db)
    assert _replay(dashboard, letter, csrf) == 403
    assert state(db) == before


def test_an_idle_session_ends_and_a_busy_one_ends_with_its_lifetime(db: TestDatabase) -> None:
    letter = dead_letter(db)
    saga_id = start_trip(db, "t-1")
    clock = FakeClock()
    guard = Guard(TOKEN, SessionStore(idle_timeout_s=600, lifetime_s=3000, clock=clock))
    with dashboard_client(db, guard) as client:
        csrf = sign_in(client, saga_id=saga_id)
        for _ in range(4):
            clock.now += 590
            assert "signed in as" in client.get("/").text
        clock.now += 601
        assert "signed in as" not in client.get("/").text
        assert _replay(client, letter, csrf) == 403
        csrf = sign_in(client, saga_id=saga_id)
        for _ in range(5):
            clock.now += 590
            assert "signed in as" in client.get("/").text
        clock.now += 590  # 3,540 s after sign-in
        assert _replay(client, letter, csrf) == 403
    assert db.scalar("SELECT status FROM saga.dead_letters WHERE id = %s", (letter,)) == "pending"


def test_a_csrf_token_works_in_its_own_session_only(
    dashboard: TestClient, db: TestDatabase
) -> None:
    letter = dead_letter(db)
    start_trip(db, "t-1")
    first_csrf = sign_in(dashboard, "ada")
    dashboard.cookies.clear()
    second_csrf = sign_in(dashboard, "ada")  # ada again, in another browser
    before = state(db)
    assert first_csrf != second_csrf
    assert _replay(dashboard, letter, first_csrf) == 403
    assert state(db) == before
    assert _replay(dashboard, letter, second_csrf) == 303


def test_a_session_is_bound_to_the_token_it_was_opened_with(db: TestDatabase) -> None:
    letter = dead_letter(db)
    start_trip(db, "t-1")
    sessions = SessionStore()
    with dashboard_client(db, Guard(TOKEN, sessions)) as client:
        csrf = sign_in(client)
        cookie = client.cookies[SESSION_COOKIE]
    with dashboard_client(db, Guard("a-new-token", sessions)) as client:
        client.cookies.set(SESSION_COOKIE, cookie)
        assert "signed in as" not in client.get("/").text
        assert _replay(client, letter, csrf) == 403
    assert db.scalar("SELECT status FROM saga.dead_letters WHERE id = %s", (letter,)) == "pending"


def test_purging_needs_the_dry_runs_confirmation(dashboard: TestClient, db: TestDatabase) -> None:
    letter = dead_letter(db)
    start_trip(db, "t-1")
    csrf = sign_in(dashboard)
    preview = dashboard.get(f"/dead-letters/trips/replay?ids={letter}").text
    assert 'name="confirm"' in preview and "required" in preview
    before = state(db)
    response = dashboard.post("/dead-letters/trips/purge", data={"ids": str(letter), "csrf": csrf})
    assert response.status_code == 303
    assert "nothing purged" in dashboard.get(response.headers["location"]).text
    assert state(db) == before
    form = {"ids": str(letter), "csrf": csrf, "confirm": "purge"}
    assert dashboard.post("/dead-letters/trips/purge", data=form).status_code == 303
    assert db.scalar("SELECT status FROM saga.dead_letters WHERE id = %s", (letter,)) == "purged"


def test_only_the_server_puts_messages_on_a_page(dashboard: TestClient, db: TestDatabase) -> None:
    crafted = "Token leaked: run saga dlq purge --all"
    for name in ("problem", "notice", "error", "flash"):
        page = dashboard.get(f"/?{name}={quote(crafted)}").text
        assert "Token leaked" not in page, name
    letter = dead_letter(db)
    start_trip(db, "t-1")
    csrf = sign_in(dashboard)
    response = dashboard.post("/dead-letters/trips/replay", data={"ids": str(letter), "csrf": csrf})
    assert "?" not in response.headers["location"]
    assert "replayed 1 dead letter(s)" in dashboard.get(response.headers["location"]).text
    assert "replayed 1 dead letter(s)" not in dashboard.get("/dead-letters").text  # once


def test_signing_in_returns_to_the_page_the_operator_was_on(
    dashboard: TestClient, db: TestDatabase
) -> None:
    saga_id = start_trip(db, "t-1")
    page = dashboard.get(f"/sagas/trips/{saga_id}?x=1").text
    link = re.search(r'href="(/login\?next=[^"]+)"', page)
    assert link, page
    form = dashboard.get(unescape(link.group(1))).text
    found = re.search(r'name="next" value="([^"]+)"', form)
    assert found and unescape(found.group(1)) == f"/sagas/trips/{saga_id}?x=1"
    response = dashboard.post(
        "/login", data={"token": TOKEN, "operator": "ada", "next": unescape(found.group(1))}
    )
    assert response.headers["location"] == f"/sagas/trips/{saga_id}?x=1"
    away = {"token": TOKEN, "operator": "ada", "next": "//evil.example/"}
    assert dashboard.post("/login", data=away).headers["location"] == "/"


def test_every_answer_carries_the_security_headers(dashboard: TestClient, db: TestDatabase) -> None:
    saga_id = start_trip(db, "t-1")
    letter = dead_letter(db)
    answers = [
        dashboard.get(path)
        for path in (
            "/", "/sagas", f"/sagas/trips/{saga_id}", "/dead-letters", "/actions", "/login",
            f"/dead-letters/trips/{letter}", f"/dead-letters/trips/replay?ids={letter}", "/nothing",
            "/sagas/trips/not-a-uuid", "/static/dashboard.js", "/static/dashboard.css",
        )
    ]  # fmt: skip
    answers.append(dashboard.post("/dead-letters/trips/replay", data={"ids": str(letter)}))
    answers.append(dashboard.post("/login", data={"token": "wrong", "operator": "ada"}))
    for answer in answers:
        policy = answer.headers.get("content-security-policy", "")
        directives = {d.split()[0]: d.split()[1:] for d in policy.split("; ") if d}
        assert directives.get("script-src") == ["'self'"], (answer.url, policy)
        assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy
        assert directives.get("frame-ancestors") == ["'none'"], (answer.url, policy)
        assert answer.headers.get("x-content-type-options") == "nosniff", answer.url
        for name, value in SECURITY_HEADERS.items():
            assert answer.headers.get(name) == value, (answer.url, name)
