"""Settings from the environment (``SAGA_*``), read only by the CLI layer.

The library itself takes explicit objects; this module is how the ``saga``
command turns environment variables and options into them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from saga.broker.transport import (
    DEFAULT_DELIVERY_LIMIT,
    DEFAULT_HEARTBEAT,
    DEFAULT_VISIBILITY_TIMEOUT,
)
from saga.db.connections import DatabaseAccess, Pooler, Wakeups
from saga.db.sql import validate_schema
from saga.effects.side_effects import DEFAULT_LEASE
from saga.errors import ConfigurationError
from saga.messaging.signing import KeyRing
from saga.observability.redaction import password_of, passwords_of, redact_url

ENV_DATABASE_URL = "SAGA_DATABASE_URL"
ENV_BROKER_URL = "SAGA_BROKER_URL"
ENV_SCHEMA = "SAGA_SCHEMA"
ENV_ACCEPT_REDIS_MESSAGE_LOSS = "SAGA_ACCEPT_REDIS_MESSAGE_LOSS"
ENV_QUEUE_TYPE = "SAGA_QUEUE_TYPE"
ENV_DELIVERY_LIMIT = "SAGA_DELIVERY_LIMIT"
ENV_POOLER = "SAGA_POOLER"
ENV_WAKEUPS = "SAGA_WAKEUPS"
ENV_LISTEN_DATABASE_URL = "SAGA_LISTEN_DATABASE_URL"


class Settings(BaseSettings):
    """Connection settings shared by every ``saga`` subcommand."""

    model_config = SettingsConfigDict(env_prefix="SAGA_", extra="ignore", populate_by_name=True)

    database_url: str | None = None
    broker_url: str | None = None
    redis_url: str | None = None
    broker_heartbeat: int = DEFAULT_HEARTBEAT
    #: Run on a Redis broker that loses messages when it restarts (refused otherwise).
    accept_redis_message_loss: bool = False
    #: Redis: seconds before a message taken by a consumer that died is delivered again.
    redis_visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT
    #: PostgreSQL broker: seconds a consumer holds a message it took (renewed while it lives).
    broker_lease: float = 30.0
    #: PostgreSQL broker: wake consumers with LISTEN/NOTIFY (false: poll only, for poolers;
    #: unset: listen unless behind a transaction pooler or SAGA_WAKEUPS=poll).
    broker_listen: bool | None = None
    #: What stands before every PostgreSQL this process uses (the database, a PostgreSQL
    #: broker): ``none``, or ``transaction`` for PgBouncer's transaction mode.
    pooler: Pooler = Pooler.NONE
    #: How a waiting relay learns of new outbox rows: ``listen`` (LISTEN/NOTIFY, on
    #: SAGA_LISTEN_DATABASE_URL behind a pooler) or ``poll``.
    wakeups: Wakeups = Wakeups.LISTEN
    #: A direct URL to the database, past the pooler, for the relay's LISTEN connection.
    listen_database_url: str | None = None
    #: RabbitMQ: ``quorum`` declares the destinations' queues as quorum queues (a cluster).
    queue_type: Literal["classic", "quorum"] = "classic"
    #: Quorum queues: a message delivered this many times without an acknowledgement (its
    #: consumer died on it each time) becomes a dead letter instead of being handled again.
    delivery_limit: int = Field(default=DEFAULT_DELIVERY_LIMIT, ge=1)
    side_effect_lease: float = DEFAULT_LEASE.total_seconds()
    signing_keys: SecretStr | None = None
    require_signature: bool = False
    db_schema: str = Field(
        default="saga", validation_alias=AliasChoices("SAGA_SCHEMA", "db_schema")
    )

    @field_validator("db_schema")
    @classmethod
    def _schema_is_identifier(cls, value: str) -> str:
        return validate_schema(value)

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name and name.endswith("_url") and value else value

    def key_ring(self) -> KeyRing | None:
        """The signing key ring from ``SAGA_SIGNING_KEYS`` / ``SAGA_REQUIRE_SIGNATURE``.

        None when signing is not configured at all (messages are neither signed nor checked).
        """
        spec = self.signing_keys.get_secret_value() if self.signing_keys else None
        ring = KeyRing.parse(spec, require=self.require_signature)
        return ring if ring.keys else None  # a ring that requires signatures has keys

    def database_access(self) -> DatabaseAccess:
        """Direct or through a transaction pooler, and where wake-ups come from
        (:class:`ConfigurationError` for settings that contradict each other)."""
        return DatabaseAccess(self.pooler, self.wakeups, self.listen_database_url)

    def broker_listens(self) -> bool:
        """Whether a PostgreSQL broker's consumers LISTEN (else they poll)."""
        can_listen = self.pooler is Pooler.NONE and self.wakeups is Wakeups.LISTEN
        if self.broker_listen and not can_listen:
            raise ConfigurationError(
                f"SAGA_BROKER_LISTEN=true contradicts {ENV_POOLER}={self.pooler.value} "
                f"{ENV_WAKEUPS}={self.wakeups.value}: the PostgreSQL broker cannot LISTEN "
                "through a transaction pooler, and polls when wake-ups are polled"
            )
        return can_listen if self.broker_listen is None else self.broker_listen

    def secrets(self) -> list[str]:
        """Every secret these settings hold, to scrub from logs."""
        found = [password_of(self.database_url), *passwords_of(self.broker_url)]
        found.append(password_of(self.listen_database_url))
        if self.signing_keys:
            ring = KeyRing.parse(self.signing_keys.get_secret_value())
            found += [secret.decode() for _, secret in ring.keys]
        return [s for s in found if s]

    def require_database_url(self) -> str:
        if not self.database_url:
            raise ConfigurationError(
                f"no database: set {ENV_DATABASE_URL} or pass --database-url "
                "(e.g. postgresql://user@localhost/orders)"
            )
        return self.database_url

    def require_broker_url(self) -> str:
        if not self.broker_url:
            raise ConfigurationError(
                f"no broker: set {ENV_BROKER_URL} or pass --broker-url "
                "(e.g. amqp://guest:guest@localhost:5672// or redis://localhost:6379/0)"
            )
        return self.broker_url


def load_settings(**overrides: str | None) -> Settings:
    """Environment settings, with non-None ``overrides`` (from command-line options) on top."""
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return Settings(**given)  # type: ignore[arg-type]
    except ConfigurationError:
        raise
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
