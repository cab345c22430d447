"""RabbitMQ publisher confirms, waited for a whole batch at once.

A channel in confirm mode (``confirm.select``) numbers the messages published on it
from 1, and the broker settles each number with ``basic.ack`` (it has the message: on a
quorum queue, a majority of the queue's members has it) or ``basic.nack`` (it could not
take it), one by one or up to a number (``multiple``). A ``mandatory`` message that no
queue takes comes back as ``basic.return`` before its ack.

kombu's ``confirm_publish`` waits for each message's confirm before it sends the next
(one round trip each). Here a batch is published first and its confirms are waited for
afterwards, all of them in one wait: :meth:`PublisherConfirms.published` counts each
publish, :meth:`PublisherConfirms.wait` reads the broker's answers until every message
is settled and returns the ids of those it refused.

Confirms replace AMQP transactions (``tx.select``/``tx.commit``): RabbitMQ documents its
``tx`` class as closer to batching than to ACID, and confirms as its data-safety
mechanism; docs/scaling.md gives the measurements behind the choice.
"""

from __future__ import annotations

import time
from typing import Any

from kombu import Connection

from saga.errors import PublishNotConfirmed

#: Seconds to wait for a batch's confirms before giving the connection up (a quorum
#: queue confirms once a majority of its members has the message: after a leader
#: election, which takes seconds, or never while a majority is down).
DEFAULT_CONFIRM_TIMEOUT = 60.0
#: Seconds between heartbeat checks while confirms are awaited.
_CHECK_EVERY = 1.0


class PublisherConfirms:
    """The confirms of one py-amqp channel, put in confirm mode by the constructor.

    Only the publisher that owns the channel may publish on it: the broker numbers every
    message published on the channel, and :meth:`published` must count each one.
    """

    def __init__(self, channel: Any, timeout: float = DEFAULT_CONFIRM_TIMEOUT) -> None:
        self.timeout = timeout
        self._next_tag = 1
        self._awaited: dict[int, str] = {}  # delivery tag -> message id
        self._nacked: set[str] = set()
        channel.confirm_select()
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)

    def published(self, message_id: str) -> None:
        """Count one ``basic.publish`` on the channel, the message known by ``message_id``."""
        self._awaited[self._next_tag] = message_id
        self._next_tag += 1

    def wait(self, connection: Connection) -> set[str]:
        """Read the broker's answers until every counted message is settled; return the ids
        of those it nacked.

        A lost connection raises (the messages' fate is then unknown), and so does a batch
        still unsettled after :attr:`timeout` seconds (:class:`PublishNotConfirmed`).
        """
        deadline = time.monotonic() + self.timeout
        while self._awaited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishNotConfirmed(
                    f"RabbitMQ left {len(self._awaited)} published messages unconfirmed for "
                    f"{self.timeout:g} s; their outbox rows stay, to be published again"
                )
            try:
                connection.drain_events(timeout=min(remaining, _CHECK_EVERY))
            except TimeoutError:
                connection.heartbeat_check()  # raises once the broker has gone silent
        nacked, self._nacked = self._nacked, set()
        return nacked

    def _settle(self, tag: int, multiple: bool) -> list[str]:
        tags = [t for t in self._awaited if t <= tag] if multiple else [tag]
        return [self._awaited.pop(t) for t in tags if t in self._awaited]

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._nacked.update(self._settle(delivery_tag, multiple))
