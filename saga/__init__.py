"""Outbox-based, message-passing sagas on PostgreSQL.

Everything a service needs to define sagas and handlers and to write messages
comes from here, in one import line. None of it loads a broker client: the
runtime that talks to brokers lives in :mod:`saga.consumers` and :mod:`saga.outbox_relay`.
"""

from importlib.metadata import version as _version

from saga.db.sql import AsyncTx, Tx
from saga.engine.definition import Saga, StepRetry
from saga.engine.registry import SagaRegistry
from saga.errors import (
    ConfigurationError,
    IdempotencyKeyReused,
    InvalidIdentifier,
    MessageTooLarge,
    SagaError,
    StepFailed,
    UnknownMessageType,
)
from saga.handlers.context import HandlerContext
from saga.handlers.retry import RetryPolicy
from saga.handlers.service import Service
from saga.messaging.control import FailureReply
from saga.messaging.envelope import Envelope, message_type_of
from saga.messaging.ids import uuid7
from saga.messaging.outbox import Outbox, OutgoingMessage

#: The installed distribution's version (``saga-outbox`` in pyproject.toml).
__version__ = _version("saga-outbox")

__all__ = [
    "AsyncTx",
    "ConfigurationError",
    "Envelope",
    "FailureReply",
    "HandlerContext",
    "IdempotencyKeyReused",
    "InvalidIdentifier",
    "MessageTooLarge",
    "Outbox",
    "OutgoingMessage",
    "RetryPolicy",
    "Saga",
    "SagaError",
    "SagaRegistry",
    "Service",
    "StepFailed",
    "StepRetry",
    "Tx",
    "UnknownMessageType",
    "__version__",
    "message_type_of",
    "uuid7",
]
