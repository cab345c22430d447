"""One consumer worker: a broker connection, a database connection, a loop.

The loop waits for a delivery, then takes every further delivery that is
already waiting (up to ``prefetch``) and handles them all in one database
transaction. Acknowledgements are sent only after that transaction commits:
a crash in between means redelivery, and the inbox makes it harmless.

On quorum queues the broker counts, in ``x-delivery-count``, the deliveries of a
message that came back unsettled, and the consumer dead-letters a message whose
count reached ``delivery_limit`` (:mod:`saga.consumers.failures`). A consumer
that dies returns every delivery it held, and each one's count goes up, not only
the one it died on; so a worker starts careful, taking one delivery at a time
while what it gets are such redeliveries, and opens up to ``prefetch`` at the
first fresh delivery. A message it keeps dying on then counts alone, and the
messages behind it are neither held nor counted with it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import psycopg
from kombu import Connection, Consumer
from kombu.message import Message

from saga.broker.reconnect import close_quietly, connect_with_retry, transient_errors
from saga.broker.transport import (
    DEFAULT_DELIVERY_LIMIT,
    BrokerConfig,
    Topology,
    check_events_supported,
    declare_subscriptions,
    delivery_count,
)
from saga.consumers.delivery_batches import Delivery, DeliveryBatchProcessor, DeliveryOutcome
from saga.consumers.stuck_sweep import StuckSweep
from saga.db.connections import DIRECT, DatabaseAccess
from saga.db.sql import validate_schema
from saga.effects.side_effects import DEFAULT_LEASE as DEFAULT_SIDE_EFFECT_LEASE
from saga.effects.side_effects import SideEffects
from saga.errors import ConfigurationError, SagaError
from saga.faults import fault_point
from saga.handlers.service import DEFAULT_REPLY_LINGER, Service
from saga.messaging.control import ResumeSaga
from saga.messaging.envelope import CONTENT_TYPE, Envelope
from saga.messaging.events import EventRecords
from saga.messaging.leases import DEFAULT_LEASE, Leases, leasing
from saga.messaging.outbox import DEFAULT_MAX_MESSAGE_BYTES
from saga.messaging.signing import KeyRing
from saga.observability.logs import log_context
from saga.observability.metrics import Metrics
from saga.observability.redaction import password_of, redact_text, redact_url
from saga.outbox_relay.claims import OutboxRow as RelayRow
from saga.outbox_relay.claims import RelayStore
from saga.outbox_relay.publisher import BatchPublisher

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    """Tuning knobs of a consumer service."""

    schema: str = "saga"
    concurrency: int = 1
    prefetch: int = 100
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    poll_timeout: float = 0.5
    poison_threshold: int = 5
    #: Verify signatures (and, if the ring requires it, reject unsigned messages).
    signing: KeyRing | None = None
    #: A batch waiting longer than this for a row lock is rolled back and handled one by one.
    batch_lock_timeout_ms: int = 250
    #: Publish the messages a batch wrote right after it commits (the relay remains the
    #: safety net for anything this misses); cuts a relay poll out of every hop's latency.
    publish_after_commit: bool = True
    #: Seconds a reply that arrives alone waits for more deliveries when replies to its
    #: siblings (the replies to the commands sent with its own: a parallel group's, a
    #: fan-out's first items) are still to come, so that they are handled in
    #: one transaction instead of one behind the other (0: never waits).
    reply_linger: float = DEFAULT_REPLY_LINGER.total_seconds()
    #: Seconds the messages a batch wrote stay leased to this consumer: the relays take
    #: them only after that (when it died, or its publish failed).
    publish_lease: float = DEFAULT_LEASE.total_seconds()
    #: How long a side-effect call may run before another attempt may take it over.
    side_effect_lease: float = DEFAULT_SIDE_EFFECT_LEASE.total_seconds()
    #: Quorum queues: deliveries of one message that may come back unsettled (its consumer
    #: died each time) before the next one is dead-lettered instead of handled.
    delivery_limit: int = DEFAULT_DELIVERY_LIMIT
    #: Direct or through a transaction-mode pooler (no prepared statements then).
    database: DatabaseAccess = DIRECT
    #: A saga home service's consumer resumes its sagas with no progress for this long
    #: (:mod:`saga.consumers.stuck_sweep`); None: only an operator resumes them.
    resume_stuck_after: timedelta | None = None

    def __post_init__(self) -> None:
        validate_schema(self.schema)
        if self.concurrency < 1 or self.prefetch < 1:
            raise ValueError("concurrency and prefetch must be at least 1")
        if self.reply_linger < 0:
            raise ValueError(f"reply_linger must be 0 or more seconds, not {self.reply_linger}")
        if self.publish_lease <= 0:
            raise ValueError(f"publish_lease must be positive seconds, not {self.publish_lease}")


class Worker:
    """Consumes one service's queue until told to stop."""

    def __init__(
        self,
        service: Service,
        database_url: str,
        broker: BrokerConfig,
        options: ConsumerOptions | None = None,
        topology: Topology | None = None,
        name: str = "worker-1",
        metrics: Metrics | None = None,
    ) -> None:
        self.service = service
        self.database_url = database_url
        self.broker = broker
        self.options = options or ConsumerOptions()
        if service.schema not in (None, self.options.schema):
            raise ConfigurationError(
                f"service {service.name!r} keeps its sagas in schema {service.schema!r}, but "
                f"its consumer would run on schema {self.options.schema!r}: give both the "
                "same schema (the registry's schema=, and --schema or SAGA_SCHEMA)"
            )
        self.topology = topology or Topology()
        self.name = name
        self.processor = DeliveryBatchProcessor(
            service,
            schema=self.options.schema,
            max_message_bytes=self.options.max_message_bytes,
            metrics=metrics,
            signing=self.options.signing,
            batch_lock_timeout_ms=self.options.batch_lock_timeout_ms,
            delivery_limit=self.options.delivery_limit,
            effects=SideEffects(
                database_url,
                schema=self.options.schema,
                lease=timedelta(seconds=self.options.side_effect_lease),
                connection_kwargs=self.options.database.connection_kwargs(),
            ),
        )
        self.counts: Counter[DeliveryOutcome] = Counter()
        self._secret = password_of(database_url)
        self._buffer: list[Message] = []
        self._batch_failures: Counter[str] = Counter()
        self._db: psycopg.Connection[Any] | None = None
        #: Taking one delivery at a time until a fresh one comes (quorum queues).
        self._careful = False
        self._broker_conn: Connection | None = None
        self._consumer: Consumer | None = None
        self._publisher: BatchPublisher | None = None
        self._relay_store = RelayStore(self.options.schema)
        #: the rows this worker's batches write, leased to it to publish after each commit
        self._leases = Leases(timedelta(seconds=self.options.publish_lease))
        self._events = EventRecords(self.options.schema)
        self._metrics = metrics
        self.stuck_sweep = _stuck_sweep(service, self.options)
        self.ready = threading.Event()
        self.failure: Exception | None = None

    def __repr__(self) -> str:
        return (
            f"Worker({self.service.name!r}, {self.name}, "
            f"database={redact_url(self.database_url)!r}, broker={self.broker!r})"
        )

    # -- lifecycle -----------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set; reconnect after database or broker loss."""
        while not stop.is_set():
            try:
                self._connect_with_retry(stop)
                if stop.is_set():
                    break
                self.ready.set()
                with log_context(consumer=self.service.name):
                    self._loop(stop)
            except SagaError as exc:
                logger.error("%s cannot run: %s", self.name, exc)
                self.failure = exc
                stop.set()
            except self._transient_errors() as exc:
                logger.warning(
                    "%s lost a connection, reconnecting: %s",
                    self.name,
                    redact_text(str(exc), self._secret),
                    extra={"consumer": self.service.name},
                )
                stop.wait(0.5)
            except Exception as exc:
                # A bug or an unexpected failure: stop the whole service loudly (a supervisor
                # restarts it) rather than leave a worker silently dead.
                logger.exception("%s stopped by an unexpected error", self.name)
                self.failure = exc
                stop.set()
            finally:
                self.ready.clear()
                self._close()
        close_quietly(logger, self.processor.effects)

    def _connect(self) -> None:
        self._close()
        try:
            self._db = self.options.database.connect(self.database_url, autocommit=True)
        except psycopg.OperationalError as exc:
            raise ConnectionError(redact_text(str(exc), self._secret)) from None
        for hook in self.service.connect_hooks:
            with self._db.transaction():
                hook(self._db)
        conn = self.broker.connected()
        self._broker_conn = conn
        self.broker.check_connected(conn)
        channel = conn.channel()
        queue = self.topology.queue(self.service.name)
        queue(channel).declare()
        self._subscribe(conn, channel)
        self._buffer.clear()
        self._careful = self.topology.is_quorum
        self._consumer = Consumer(
            channel,
            queues=[queue],
            on_message=self._buffer.append,
            # kombu could not read the body (a compression header it does not know, or a
            # body that does not decompress): handled all the same, to be dead-lettered.
            on_decode_error=lambda message, _exc: self._buffer.append(message),
            accept=[CONTENT_TYPE],
            prefetch_count=1 if self._careful else self.options.prefetch,
        )
        self._consumer.consume()
        self._publisher = BatchPublisher(conn, self.topology, signing=self.options.signing)
        logger.info("%s consuming %s", self.name, queue.name, extra={"consumer": self.service.name})

    def _subscribe(self, conn: Connection, channel: Any) -> None:
        """Bind the service's queue to the events it subscribes to, unbind it from those it
        recorded before and dropped since, and record what it is bound to now."""
        events = self.service.subscriptions
        db = self._db
        assert db is not None
        where = (redact_url(self.broker.url), self.topology.queue_name(self.service.name))
        with db.transaction():  # the broker refuses, and nothing is recorded
            dropped = self._events.replace_subscriptions(db, self.service.name, events, *where)
            if not (events or dropped):
                return
            check_events_supported(conn, f"service {self.service.name!r} subscribes to {events}")
            declare_subscriptions(channel, self.topology, self.service.name, events, dropped)
        if dropped:
            logger.info("%s no longer subscribes to %s: unbound", self.name, dropped)

    def _close(self) -> None:
        try:
            self._settle_published()
        except psycopg.Error:  # gone with the connection: the relays take them once leases end
            logger.debug("settling published rows failed", exc_info=True)
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None
        if self._consumer is not None:
            try:
                self._consumer.cancel()
            except Exception:
                logger.debug("cancelling the consumer failed", exc_info=True)
        close_quietly(logger, self._broker_conn, self._db)
        self._consumer = None
        self._broker_conn = None
        self._db = None
        self._buffer.clear()

    # -- the loop ------------------------------------------------------------

    def _loop(self, stop: threading.Event) -> None:
        conn = self._broker_conn
        assert conn is not None
        last_heartbeat = time.monotonic()
        while not stop.is_set():
            if self.broker.capabilities.heartbeats and time.monotonic() - last_heartbeat >= 1.0:
                conn.heartbeat_check()
                last_heartbeat = time.monotonic()
            if self.stuck_sweep is not None and self.stuck_sweep.due():
                assert self._db is not None
                self.stuck_sweep.sweep(self._db)
            if not self._buffer:
                try:
                    conn.drain_events(timeout=self.options.poll_timeout)
                except TimeoutError:
                    self._settle_published()
                    continue
            self._take_waiting(conn)
            batch = self._buffer[: self.options.prefetch]
            del self._buffer[: len(batch)]
            if len(batch) == 1 and self._more_to_come(batch[0]):
                batch += self._linger(conn)
            self._handle(batch)
            if self._careful and not any(delivery_count(m.headers) for m in batch):
                self._open_up()

    def _open_up(self) -> None:
        """Consume again with the full prefetch: the redeliveries are behind.

        A new prefetch applies to the consumers started after it; what the old one got
        before its cancel was confirmed is in the buffer, on the same channel.
        """
        consumer = self._consumer
        assert consumer is not None
        consumer.cancel()
        consumer.qos(prefetch_count=self.options.prefetch)
        consumer.consume()
        self._careful = False

    def _more_to_come(self, message: Message) -> bool:
        """Whether replies to the siblings of what ``message`` answers are still to come
        (:mod:`saga.engine.reply_joins`): a hint, read before the message is checked."""
        joins = self.service.reply_joins
        if joins is None or self.options.reply_linger <= 0 or self._careful:
            return False
        if (message.headers or {}).get("message_type") not in joins.types:
            return False
        try:
            envelope = Envelope.from_bytes(_delivery(message).body)
        except ValueError:  # not an envelope: its checks refuse it
            return False
        return joins.more_to_come(envelope)

    def _linger(self, conn: Connection) -> list[Message]:
        """Wait up to ``reply_linger`` while the deliveries that come are replies with
        siblings still to come; what came, to handle with the reply taken (up to the
        prefetch). Anything else arriving, or the last sibling, ends the wait."""
        deadline = time.monotonic() + self.options.reply_linger
        more: list[Message] = []
        while len(more) < self.options.prefetch - 1:
            if not self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    conn.drain_events(timeout=remaining)
                except TimeoutError:
                    break
            self._take_waiting(conn)
            arrived = self._buffer[: self.options.prefetch - 1 - len(more)]
            del self._buffer[: len(arrived)]
            more += arrived
            # a list, not a generator: every arrival is counted among its saga's replies seen
            if not all([self._more_to_come(message) for message in arrived]):
                break
        return more

    def _take_waiting(self, conn: Connection) -> None:
        while len(self._buffer) < self.options.prefetch:
            try:
                conn.drain_events(timeout=0)
            except TimeoutError:
                return

    def _handle(self, messages: list[Message]) -> None:
        db = self._db
        assert db is not None
        deliveries = [_delivery(m) for m in messages]
        leased: AbstractContextManager[Leases | None] = (
            leasing(self._leases) if self.options.publish_after_commit else nullcontext()
        )
        try:
            with leased:
                outcomes = self.processor.process(db, deliveries)
            committed_at = time.time()
        except psycopg.OperationalError:
            raise  # the database is gone: reconnect; the broker will redeliver
        except Exception as exc:
            if len(messages) > 1:
                logger.info("batch of %d rolled back (%s); handling one by one", len(messages), exc)
                for message in messages:
                    self._handle([message])
                return
            self._single_failed(db, messages[0], deliveries[0], exc)
            return
        self.counts.update(outcomes)
        if self.options.publish_after_commit and self._leases.written:
            # the acknowledgement goes out in the rows' write, after them
            self._publish_own(committed_at, then=partial(self._ack, messages))
        else:
            self._ack(messages)
        fault_point("consumer.after_ack")

    def _ack(self, messages: list[Message]) -> None:
        """Acknowledge a committed batch: one frame for all of it where the broker takes a
        multiple ack (RabbitMQ).

        Every earlier delivery of this channel is settled already (the batch takes the
        oldest waiting ones, and failed ones are settled one by one), so ``multiple``
        acknowledges exactly this batch. Other brokers ack one by one.
        """
        if self.broker.capabilities.multiple_ack:
            messages[-1].ack(multiple=True)
            return
        for message in messages:
            message.ack()

    def _publish_own(self, committed_at: float, then: Callable[[], object]) -> None:
        """Publish the rows this batch wrote, leased to this worker: no transaction; ``then``
        (the batch's acknowledgement) is sent in the same write, before the wait for the
        broker's confirms.

        The published ones are deleted in bulk later (:meth:`_settle_published`, or the
        next batch's closing statement), and the events no subscriber took are counted
        with them: no transaction of their own. Rows the broker refused, or all of them
        when the publish broke off, are handed to the relays at once (their lease
        released); were that impossible too, the relays take them when the lease ends.
        """
        publisher = self._publisher
        assert publisher is not None
        leases = self._leases
        rows = [
            RelayRow(r.id, r.message_id, r.destination, r.message_type, r.body, 0)
            for r in leases.written
        ]
        leases.forget_written()
        try:
            outcome = publisher.publish(rows, committed_at, then)
        except self._transient_errors():
            self._release([row.id for row in rows])
            raise
        leases.published += outcome.published
        leases.unrouted += outcome.unrouted
        if outcome.failed:
            self._release(list(outcome.failed))
        if outcome.unrouted and self._metrics is not None:
            self._metrics.count_unrouted(outcome.unrouted)

    def _release(self, ids: list[int]) -> None:
        """Leave rows this worker could not publish to the relays now (best effort)."""
        db = self._db
        try:
            assert db is not None
            self._relay_store.release(db, ids)  # one statement: a transaction of its own
        except psycopg.Error:  # the relays take them when their lease ends
            logger.debug("releasing %d leased row(s) failed", len(ids), exc_info=True)

    def _settle_published(self) -> None:
        """Delete the rows published after earlier commits and count the events among them
        that reached no subscriber, all at once (when idle; else the next batch does)."""
        leases = self._leases
        db = self._db
        if not (leases.published or leases.unrouted) or db is None:
            return
        self._relay_store.settle(db, leases.published, leases.unrouted)
        leases.published.clear()
        leases.unrouted.clear()

    def _single_failed(
        self, db: psycopg.Connection[Any], message: Message, delivery: Delivery, exc: Exception
    ) -> None:
        # Count failures per message, not per delivery: a redelivery gets a new tag.
        key = str(message.properties.get("message_id") or hashlib.sha256(delivery.body).hexdigest())
        self._batch_failures[key] += 1
        if self._batch_failures[key] >= self.options.poison_threshold:
            logger.error("message %s keeps failing its transaction; dead-lettering it", key)
            self.processor.dead_letter_poison(db, delivery, exc)
            message.ack()
            del self._batch_failures[key]
            self.counts[DeliveryOutcome.DEAD_LETTERED] += 1
        else:
            logger.warning("transaction for message %s failed (%s); requeueing", key, exc)
            message.requeue()

    # -- helpers -------------------------------------------------------------

    def _connect_with_retry(self, stop: threading.Event) -> None:
        connect_with_retry(self._connect, self._transient_errors(), stop, logger)

    def _transient_errors(self) -> tuple[type[BaseException], ...]:
        return transient_errors(self._broker_conn or self.broker.connect())


def _stuck_sweep(service: Service, options: ConsumerOptions) -> StuckSweep | None:
    """The sweep resuming ``service``'s stuck sagas, if asked for and if it is a home."""
    if options.resume_stuck_after is None:
        return None
    if ResumeSaga.message_type not in service.message_types:
        logger.debug("%s hosts no sagas: nothing to resume", service.name)
        return None
    return StuckSweep(options.schema, service.name, options.resume_stuck_after)


def _delivery(message: Message) -> Delivery:
    body = message.body
    if isinstance(body, str):
        body = body.encode("utf-8")
    unreadable = None
    if message.errors:
        error = message.errors[0][1]
        unreadable = f"{type(error).__name__}: {error}"
    return Delivery(
        body=bytes(body or b""),
        content_type=message.content_type,
        headers=message.headers,
        unreadable=unreadable,
    )
