"""The dashboard's set-up without a server: which databases, and who may act."""

from __future__ import annotations

from typing import Any

import pytest

from saga.dashboard.app import local_page
from saga.dashboard.databases import ServiceDatabase, parse_databases
from saga.dashboard.security import Guard
from saga.dashboard.sessions import SessionStore
from saga.errors import ActionRefused, ConfigurationError, InvalidIdentifier


def test_each_database_is_labelled_by_its_service() -> None:
    found = parse_databases(
        ["orders=postgresql://u:pw@db1/orders_db", "postgresql://db2/payments"], "saga"
    )
    assert found == [
        ServiceDatabase("orders", "postgresql://u:pw@db1/orders_db"),
        ServiceDatabase("payments", "postgresql://db2/payments"),
    ]
    assert "pw" not in repr(found[0])


@pytest.mark.parametrize(
    ("specs", "error"),
    [
        ([], "no database"),
        (["orders=db1"], "is not SERVICE=URL"),
        (["a=postgresql://x/a", "a=postgresql://y/a"], "two databases"),
    ],
)
def test_bad_database_lists_are_refused_clearly(specs: list[str], error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        parse_databases(specs, "saga")


def test_a_service_name_must_be_a_name() -> None:
    with pytest.raises(InvalidIdentifier):
        parse_databases(["bad name=postgresql://x/a"], "saga")


class FakeClock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _signed_in(guard: Guard, operator: str = "ada") -> tuple[dict[str, Any], str]:
    """A session (the cookie's data) signed in as ``operator``, and its CSRF token."""
    session: dict[str, Any] = {}
    guard.sign_in(session, "t0ken", operator)
    found = guard.signed_in(session)
    assert found is not None and found.operator == operator
    return session, found.csrf


def test_a_csrf_token_belongs_to_its_session_only() -> None:
    guard = Guard("t0ken")
    first, first_csrf = _signed_in(guard)
    second, second_csrf = _signed_in(guard)  # the same operator, signed in twice
    assert guard.authorize(first, first_csrf) == "ada"
    assert first_csrf != second_csrf
    with pytest.raises(ActionRefused, match="CSRF"):
        guard.authorize(second, first_csrf)
    with pytest.raises(ActionRefused, match="CSRF"):
        guard.authorize(first, None)


@pytest.mark.parametrize("csrf", ["é", "é" * 43, "\x00", "\udcff" * 3])
def test_a_non_ascii_csrf_token_is_refused_not_an_error(csrf: str) -> None:
    guard = Guard("t0ken")
    session, _ = _signed_in(guard)
    with pytest.raises(ActionRefused, match="CSRF"):
        guard.authorize(session, csrf)


def test_signing_out_ends_the_session_for_good() -> None:
    guard = Guard("t0ken")
    session, csrf = _signed_in(guard)
    stolen = dict(session)  # a copy of the cookie's data
    guard.sign_out(session)
    assert guard.signed_in(stolen) is None
    with pytest.raises(ActionRefused, match="sign in"):
        guard.authorize(stolen, csrf)


def test_a_session_ends_when_idle_and_at_the_end_of_its_lifetime() -> None:
    clock = FakeClock()
    guard = Guard("t0ken", SessionStore(idle_timeout_s=60, lifetime_s=300, clock=clock))
    session, csrf = _signed_in(guard)
    for _ in range(4):  # busy: each request starts the idle time again
        clock.now += 59
        assert guard.authorize(session, csrf) == "ada"
    clock.now += 61
    assert guard.signed_in(session) is None
    busy, busy_csrf = _signed_in(guard)
    for _ in range(5):
        clock.now += 59
        guard.authorize(busy, busy_csrf)
    clock.now += 59  # 354 s after sign-in: over the lifetime, however busy
    with pytest.raises(ActionRefused, match="sign in"):
        guard.authorize(busy, busy_csrf)


def test_a_session_cookie_is_signed_with_a_key_of_its_token() -> None:
    assert Guard("t0ken").cookie_key == Guard("t0ken").cookie_key
    assert Guard("t0ken").cookie_key != Guard("another").cookie_key
    assert "t0ken" not in Guard("t0ken").cookie_key
    assert Guard(None).cookie_key != Guard(None).cookie_key  # read-only: a random key


def test_sign_in_needs_the_token_and_a_name() -> None:
    guard = Guard("t0ken")
    with pytest.raises(ActionRefused, match="wrong token"):
        guard.sign_in({}, "t0ke", "ada")
    with pytest.raises(ActionRefused, match="wrong token"):
        guard.sign_in({}, "tØken", "ada")
    with pytest.raises(ActionRefused, match="name"):
        guard.sign_in({}, "t0ken", "<script>")


def test_without_a_token_nothing_can_be_authorized() -> None:
    guard = Guard(None)
    assert guard.read_only
    with pytest.raises(ActionRefused, match="read-only"):
        guard.sign_in({}, "", "ada")
    with pytest.raises(ActionRefused, match="read-only"):
        guard.authorize({"session": "x"}, "x")


@pytest.mark.parametrize(
    ("asked", "lands"),
    [
        ("/sagas/orders/1?status=running", "/sagas/orders/1?status=running"),
        ("//evil.example/", "/"),
        ("https://evil.example/", "/"),
        ("/\\evil.example", "/"),
        ("", "/"),
        ("/a\nb", "/"),
    ],
)
def test_sign_in_returns_to_a_page_of_the_dashboard_only(asked: str, lands: str) -> None:
    assert local_page(asked) == lands
