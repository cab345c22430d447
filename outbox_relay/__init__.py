"""The relay service: publishes committed outbox rows to the broker."""

from outbox_relay.claims import OutboxRow, RelayStore
from outbox_relay.publisher import BatchPublisher, PublishOutcome
from outbox_relay.relay import BatchReport, Relay, RelayOptions

__all__ = [
    "BatchPublisher",
    "BatchReport",
    "OutboxRow",
    "PublishOutcome",
    "Relay",
    "RelayOptions",
    "RelayStore",
]
