"""The way to PostgreSQL: direct, or behind a transaction pooler, and where wake-ups come
from; settings that contradict each other are refused with a clear error."""

from __future__ import annotations

import pytest

from saga.broker.transport import BrokerConfig
from saga.db.connections import DIRECT, DatabaseAccess, Pooler, Wakeups
from saga.errors import ConfigurationError
from saga.settings import load_settings

DIRECT_URL = "postgresql://relay:s3cret@db-primary:5432/orders"


def test_a_direct_connection_keeps_prepared_statements_and_listens() -> None:
    assert DIRECT.connection_kwargs() == {}
    assert DIRECT.listens


def test_behind_a_transaction_pooler_no_statement_is_prepared() -> None:
    access = load_settings(pooler="transaction", wakeups="poll").database_access()
    assert access.connection_kwargs() == {"prepare_threshold": None}
    assert not access.listens


def test_behind_a_pooler_listening_needs_a_direct_url() -> None:
    with pytest.raises(ConfigurationError, match=r"SAGA_LISTEN_DATABASE_URL.*SAGA_WAKEUPS=poll"):
        load_settings(pooler="transaction").database_access()
    access = load_settings(pooler="transaction", listen_database_url=DIRECT_URL).database_access()
    assert access.listens and access.listen_url == DIRECT_URL
    assert "s3cret" not in repr(access)


def test_a_listen_url_with_polling_is_a_contradiction() -> None:
    with pytest.raises(ConfigurationError, match="SAGA_WAKEUPS=poll"):
        DatabaseAccess(Pooler.NONE, Wakeups.POLL, DIRECT_URL)


def test_the_postgresql_broker_polls_behind_a_pooler_and_refuses_to_listen() -> None:
    settings = load_settings(pooler="transaction", wakeups="poll")
    assert settings.broker_listens() is False
    assert load_settings().broker_listens() is True
    with pytest.raises(ConfigurationError, match="SAGA_BROKER_LISTEN=true contradicts"):
        load_settings(pooler="transaction", wakeups="poll", broker_listen="true").broker_listens()
    with pytest.raises(ConfigurationError, match="cannot LISTEN"):
        BrokerConfig("postgresql://localhost/broker", pooled=True)


def test_an_unknown_pooler_mode_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="pooler"):
        load_settings(pooler="session-ish")


def test_the_direct_url_password_is_scrubbed_from_logs() -> None:
    assert "s3cret" in load_settings(listen_database_url=DIRECT_URL).secrets()
