"""The bindings a broker routes events by, as ``saga subscriptions`` lists them (on a
broker whose capabilities have ``routing_table``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Binding:
    """One queue bound to one routing key of an exchange."""

    exchange: str
    routing_key: str
    queue: str
    created_at: datetime
