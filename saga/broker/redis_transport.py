"""kombu's Redis transport with one gap closed: a message taken off its list is never dropped.

kombu consumes with ``BRPOP`` (the message leaves the queue's list), then records it
as unacknowledged (``HSET`` into the ``unacked`` hash, from which a dead consumer's
messages are restored). If Redis goes away between the two (a restart), kombu raises
and the message, already off the list, lives only in the consumer's memory: lost, even
on a Redis that persists every write. Here the record is retried until Redis answers
again (up to :data:`RECORD_PATIENCE` seconds), so the message is delivered after all;
an acknowledgement that then fails leaves it to be redelivered, and the inbox makes
that duplicate harmless.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as kombu_redis
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

logger = logging.getLogger(__name__)

#: Seconds a consumer keeps trying to record a delivery while Redis restarts.
RECORD_PATIENCE = 60.0


class QoS(kombu_redis.QoS):  # type: ignore[misc]
    def append(self, message: Any, delivery_tag: Any) -> None:
        """Record ``message`` as unacknowledged, retrying through a Redis restart."""
        for attempt in Retrying(
            retry=retry_if_exception_type(tuple(self.channel.connection_errors)),
            wait=wait_exponential(multiplier=0.05, max=2.0),
            stop=stop_after_delay(RECORD_PATIENCE),
            before_sleep=before_sleep_log(logger, logging.WARNING),
            reraise=True,
        ):
            with attempt:
                super().append(message, delivery_tag)


class Channel(kombu_redis.Channel):  # type: ignore[misc]
    QoS = QoS


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel
