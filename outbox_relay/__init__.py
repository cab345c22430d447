"""The relay service: publishes committed outbox rows to the broker."""

from saga.namespace import refuse_bare_name
from saga.outbox_relay.claims import OutboxRow, RelayStore
from saga.outbox_relay.publisher import BatchPublisher, PublishOutcome
from saga.outbox_relay.relay import BatchReport, Relay, RelayOptions

refuse_bare_name(__name__, "saga.outbox_relay")

__all__ = [
    "BatchPublisher",
    "BatchReport",
    "OutboxRow",
    "PublishOutcome",
    "Relay",
    "RelayOptions",
    "RelayStore",
]
