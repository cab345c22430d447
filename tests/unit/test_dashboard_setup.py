"""The dashboard's set-up without a server: which databases, and who may act."""

from __future__ import annotations

import pytest

from saga.dashboard.security import Guard
from saga.dashboard.sources import ServiceDatabase, parse_databases
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


def test_a_session_and_its_csrf_token_belong_to_one_operator_and_one_token() -> None:
    guard = Guard("t0ken")
    cookie = guard.sign_in("t0ken", " ada ")
    assert guard.operator(cookie) == "ada"
    assert guard.authorize(cookie, guard.csrf_token("ada")) == "ada"
    with pytest.raises(ActionRefused, match="CSRF"):
        guard.authorize(cookie, guard.csrf_token("bob"))
    with pytest.raises(ActionRefused, match="CSRF"):
        guard.authorize(cookie, None)
    renamed = "bob|" + cookie.split("|")[1]
    assert guard.operator(renamed) is None
    other = Guard("another")
    assert other.operator(cookie) is None
    with pytest.raises(ActionRefused, match="sign in"):
        other.authorize(cookie, guard.csrf_token("ada"))


def test_sign_in_needs_the_token_and_a_name() -> None:
    guard = Guard("t0ken")
    with pytest.raises(ActionRefused, match="wrong token"):
        guard.sign_in("t0ke", "ada")
    with pytest.raises(ActionRefused, match="name"):
        guard.sign_in("t0ken", "<script>")


def test_without_a_token_nothing_can_be_authorized() -> None:
    guard = Guard(None)
    assert guard.read_only
    with pytest.raises(ActionRefused, match="read-only"):
        guard.sign_in("", "ada")
    with pytest.raises(ActionRefused, match="read-only"):
        guard.authorize("ada|x", "x")
