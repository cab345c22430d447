"""Durable batch publishing through kombu, as the broker's capabilities allow.

A broker with ``confirmed_publish`` (RabbitMQ): publisher confirms, pipelined
(:mod:`saga.broker.amqp.confirms`): the whole batch is published, then every confirm is
awaited at once. A row counts as published only once the broker acked its message; a
``basic.nack`` leaves the row failed (published again later), and a connection lost
before every ack raises (every row stays). Each publish is ``mandatory``; a
``basic.return`` (no queue for the routing key) reaches ``on_return`` before the
message's ack, so those rows are known to have failed. The batch's frames go to the
socket in one write (:func:`saga.broker.amqp.transport.gathered_writes`).

Other brokers (Redis, memory, PostgreSQL) publish through kombu's
``Producer.batch()``: one Redis pipeline, or one PostgreSQL INSERT, per batch.

An event (a row with no destination) goes to the events exchange with its type as
routing key, ``mandatory`` where the broker ``returns_unroutable``. Where the broker
``returns_unrouted_events``, a return then means that no queue subscribes to it: not
a failure, the row is done and the event counted as unrouted (the PostgreSQL broker
reports such events through the same ``on_return`` callback). A broker without
``events`` (Redis) refuses an event for good
(:func:`~saga.broker.transport.check_events_supported`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kombu import Connection, Producer

from saga.broker.amqp.confirms import PublisherConfirms
from saga.broker.amqp.transport import gathered_writes
from saga.broker.kinds import kind_of
from saga.broker.transport import Topology, check_events_supported
from saga.errors import EventsNotSupported
from saga.messaging.envelope import COMMITTED_AT_HEADER, CONTENT_ENCODING, CONTENT_TYPE
from saga.messaging.signing import KeyRing
from saga.outbox_relay.claims import OutboxRow

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class PublishOutcome:
    """Which claimed rows reached the broker, and why the others did not."""

    published: list[int] = field(default_factory=list)
    failed: dict[int, tuple[str, str]] = field(default_factory=dict)  # id -> (type, message)
    #: the failed rows no retry can publish (quarantined at once)
    permanent: set[int] = field(default_factory=set)
    #: the types of the published events that no queue subscribes to (one entry each)
    unrouted: list[str] = field(default_factory=list)

    def add(self, other: PublishOutcome) -> None:
        """Take in the outcome of a publish of some more rows."""
        self.published.extend(other.published)
        self.failed.update(other.failed)
        self.permanent.update(other.permanent)
        self.unrouted.extend(other.unrouted)


class BatchPublisher:
    """Publishes claimed outbox rows on one broker connection."""

    def __init__(
        self,
        connection: Connection,
        topology: Topology,
        *,
        declare_queues: bool = True,
        max_message_bytes: int | None = None,
        signing: KeyRing | None = None,
    ) -> None:
        self.connection = connection
        self.topology = topology
        self.declare_queues = declare_queues
        self.max_message_bytes = max_message_bytes
        self.signing = signing
        self._capabilities = kind_of(connection).capabilities
        self._returns = (
            self._capabilities.returns_unroutable or self._capabilities.returns_unrouted_events
        )
        self._events_refused: str | None = None
        try:
            check_events_supported(connection, "cannot publish this event")
        except EventsNotSupported as refused:
            self._events_refused = str(refused)
        self._channel: Any = None
        self._producer: Producer | None = None
        self._confirms: PublisherConfirms | None = None
        self._declared: set[str] = set()
        self._exchange_declared = False
        self._returned: set[str] = set()

    def close(self) -> None:
        if self._channel is not None:
            try:
                self._channel.close()
            except Exception:  # closing a broken channel must not mask the real error
                logger.debug("closing publisher channel failed", exc_info=True)
        self._channel = None
        self._producer = None
        self._confirms = None
        self._declared.clear()
        self._exchange_declared = False

    def publish(
        self,
        rows: Sequence[OutboxRow],
        committed_at: float | None = None,
        then: Callable[[], object] | None = None,
    ) -> PublishOutcome:
        """Publish ``rows`` durably; raise on connection loss (nothing is then known).

        ``committed_at`` (epoch seconds) is when the rows' transaction committed, if the
        caller knows it: it travels in the ``committed_at`` header, for latency metrics.
        ``then`` runs once the rows are sent, before the wait for the broker's confirms:
        what it sends on this connection (a consumer's acknowledgement) goes out in the
        same write as the rows, after them.
        """
        outcome = PublishOutcome()
        sendable: list[OutboxRow] = []
        for row in rows:
            if self.max_message_bytes is not None and len(row.body) > self.max_message_bytes:
                outcome.failed[row.id] = (
                    "MessageTooLarge",
                    f"{len(row.body)} bytes is over the broker limit of {self.max_message_bytes}",
                )
            elif row.destination is None and self._events_refused is not None:
                outcome.failed[row.id] = ("EventsNotSupported", self._events_refused)
                outcome.permanent.add(row.id)
            else:
                sendable.append(row)
        if not sendable:
            if then is not None:
                then()
            return outcome
        producer = self._ensure_producer()
        self._returned.clear()
        nacked: set[str] = set()
        if self._confirms is not None:
            try:
                with gathered_writes(self.connection):
                    for row in sendable:
                        self._publish_one(producer, row, committed_at)
                        self._confirms.published(str(row.message_id))
                    if then is not None:
                        then()
                nacked = self._confirms.wait(self.connection)
            except BaseException:
                self.close()  # its confirms could no longer be told apart: a new channel
                raise
        else:
            with producer.batch(max_size=max(1, len(sendable))):
                for row in sendable:
                    self._publish_one(producer, row, committed_at)
            if then is not None:
                then()
        for row in sendable:
            if str(row.message_id) in nacked:
                outcome.failed[row.id] = ("Nacked", "the broker refused the message (basic.nack)")
            elif str(row.message_id) in self._returned and row.destination is None:
                outcome.published.append(row.id)  # an event nobody subscribes to: done
                outcome.unrouted.append(row.message_type)
            elif str(row.message_id) in self._returned:
                destination = row.destination
                assert destination is not None
                outcome.failed[row.id] = (
                    "Unroutable",
                    f"no queue {self.topology.queue_name(destination)!r} for destination "
                    f"{destination!r} (returned by the broker)",
                )
                self._declared.discard(destination)
            else:
                outcome.published.append(row.id)
        return outcome

    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            self._channel = self.connection.channel()
            if self._capabilities.confirmed_publish:
                self._confirms = PublisherConfirms(self._channel)
            self._producer = Producer(
                self._channel,
                auto_declare=False,
                on_return=self._on_return if self._returns else None,
            )
        return self._producer

    def _route(self, row: OutboxRow) -> tuple[str, str]:
        """(exchange, routing key) of ``row``, its queue or exchange declared if need be: a
        command goes to its destination's queue, an event to the events exchange."""
        if row.destination is None:
            if (
                self.declare_queues and not self._exchange_declared
            ):  # a missing one closes the channel
                self.topology.events_exchange()(self._channel).declare()
                self._exchange_declared = True
            return self.topology.events_exchange_name, row.message_type
        if self.declare_queues and row.destination not in self._declared:
            self.topology.queue(row.destination).declare(channel=self._channel)
            self._declared.add(row.destination)
        return "", self.topology.queue_name(row.destination)

    def _publish_one(self, producer: Producer, row: OutboxRow, committed_at: float | None) -> None:
        exchange, routing_key = self._route(row)
        producer.publish(
            row.body,
            exchange=exchange,
            routing_key=routing_key,
            content_type=CONTENT_TYPE,
            content_encoding=CONTENT_ENCODING,
            delivery_mode=2,
            mandatory=self._capabilities.returns_unroutable,
            message_id=str(row.message_id),
            headers={
                "message_type": row.message_type,
                **({COMMITTED_AT_HEADER: f"{committed_at:.6f}"} if committed_at else {}),
                **(self.signing.sign(row.body) if self.signing else {}),
            },
            retry=False,
        )

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        message_id = message.properties.get("message_id")
        event = exchange == self.topology.events_exchange_name  # nobody subscribes: no error
        logger.log(
            logging.DEBUG if event else logging.WARNING,
            "broker returned message %s for %r: %s",
            message_id,
            routing_key,
            exc,
            extra={"message_id": message_id},
        )
        if message_id:
            self._returned.add(str(message_id))
