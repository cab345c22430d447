from __future__ import annotations

import logging

import pytest

from saga.broker.postgres import POSTGRES
from saga.broker.transport import BrokerConfig
from saga.db.sql import render, validate_name, validate_schema
from saga.errors import ConfigurationError, InvalidIdentifier
from saga.observability.logs import RedactingFilter
from saga.observability.redaction import password_of, redact_text, redact_url
from saga.settings import load_settings

SENTINEL = "s3ntinel-Pa55"


@pytest.mark.parametrize("name", ["saga", "billing_v2", "_x", "a" * 63])
def test_valid_schema_names(name: str) -> None:
    assert validate_schema(name) == name


@pytest.mark.parametrize("name", ["", "Saga", "1x", "a-b", "a b", "x;drop", "a" * 64, "ümlaut"])
def test_invalid_schema_names(name: str) -> None:
    with pytest.raises(InvalidIdentifier, match="not a valid identifier"):
        validate_schema(name)


def test_render_quotes_the_schema() -> None:
    assert render("SELECT 1 FROM {schema}.outbox WHERE id = %s", "saga") == (
        'SELECT 1 FROM "saga".outbox WHERE id = %s'
    )


@pytest.mark.parametrize("name", ["", "has space", "-lead", "x" * 201])
def test_invalid_service_names(name: str) -> None:
    with pytest.raises(InvalidIdentifier):
        validate_name(name, "service name")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (f"postgresql://app:{SENTINEL}@db:5432/orders", "postgresql://app:***@db:5432/orders"),
        ("postgresql://app@db/orders", "postgresql://app@db/orders"),
        (f"amqp://guest:{SENTINEL}@[::1]:5672//", "amqp://guest:***@[::1]:5672//"),
        (f"host=db password={SENTINEL} dbname=x", "host=db password=*** dbname=x"),
        (f"postgresql://db/x?password={SENTINEL}", "postgresql://db/x?password=***"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected
    assert SENTINEL not in redact_url(url)


def test_redact_text_and_password_of() -> None:
    url = f"postgresql://app:{SENTINEL}@db/orders"
    assert password_of(url) == SENTINEL
    text = f"could not connect to {url}; also {SENTINEL} alone"
    assert SENTINEL not in redact_text(text, SENTINEL)


def test_settings_repr_hides_passwords(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGA_DATABASE_URL", f"postgresql://app:{SENTINEL}@db/orders")
    monkeypatch.setenv("SAGA_SCHEMA", "orders_saga")
    settings = load_settings(broker_url=f"amqp://u:{SENTINEL}@mq//")
    assert settings.db_schema == "orders_saga"
    assert SENTINEL not in repr(settings)
    assert SENTINEL not in repr(BrokerConfig(settings.require_broker_url()))


def test_bad_schema_in_environment_is_refused_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGA_SCHEMA", "Robert'); DROP TABLE students;--")
    with pytest.raises(ConfigurationError, match="not a valid identifier"):
        load_settings()


def test_missing_urls_give_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAGA_DATABASE_URL", raising=False)
    monkeypatch.delenv("SAGA_BROKER_URL", raising=False)
    settings = load_settings()
    with pytest.raises(ConfigurationError, match="SAGA_DATABASE_URL"):
        settings.require_database_url()
    with pytest.raises(ConfigurationError, match="SAGA_BROKER_URL"):
        settings.require_broker_url()


def test_unsupported_broker_scheme() -> None:
    with pytest.raises(ConfigurationError, match="not supported"):
        BrokerConfig(f"kafka://u:{SENTINEL}@host")
    with pytest.raises(ConfigurationError) as info:
        BrokerConfig(f"kafka://u:{SENTINEL}@host")
    assert SENTINEL not in str(info.value)


def test_sqlalchemy_broker_schemes_are_refused_with_a_pointer_to_postgresql() -> None:
    for scheme in ("sqla+postgresql", "sqla+postgresql+psycopg"):
        with pytest.raises(ConfigurationError, match=r"SQLAlchemy.*use .*postgresql://") as info:
            BrokerConfig(f"{scheme}://u:{SENTINEL}@host/db")
        assert SENTINEL not in str(info.value)
    assert BrokerConfig("postgres://u@host/db").kind is POSTGRES


def test_logging_filter_scrubs_secrets() -> None:
    record = logging.LogRecord(
        "x", logging.WARNING, __file__, 1, "lost %s", (f"postgresql://a:{SENTINEL}@h/d",), None
    )
    RedactingFilter(SENTINEL).filter(record)
    assert SENTINEL not in record.getMessage()
