"""Outbox-based, message-passing sagas on PostgreSQL."""

from saga.definition import Saga, StepRetry
from saga.envelope import Envelope, message_type_of
from saga.errors import (
    ConfigurationError,
    InvalidIdentifier,
    MessageTooLarge,
    SagaError,
    StepFailed,
    UnknownMessageType,
)
from saga.ids import uuid7
from saga.outbox import Outbox, OutgoingMessage
from saga.registry import SagaRegistry
from saga.replies import FailureReply
from saga.transport import BrokerConfig, Topology

__all__ = [
    "BrokerConfig",
    "ConfigurationError",
    "Envelope",
    "FailureReply",
    "InvalidIdentifier",
    "MessageTooLarge",
    "Outbox",
    "OutgoingMessage",
    "Saga",
    "SagaError",
    "SagaRegistry",
    "StepFailed",
    "StepRetry",
    "Topology",
    "UnknownMessageType",
    "message_type_of",
    "uuid7",
]
