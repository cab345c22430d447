"""The relay: moves committed outbox rows to the broker.

Each batch is two statements, each a transaction of its own: lease ready rows
(``FOR UPDATE SKIP LOCKED`` picks them, so any number of relays share the work, and
a row committed late by a long transaction is simply taken later), publish them
durably, then delete them. No other relay takes a leased row while its lease runs;
a relay that dies before its delete leaves its rows to be published again once the
lease has lapsed, and consumers deduplicate by ``message_id``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any

import psycopg
from kombu import Connection

from saga.broker.reconnect import close_quietly, connect_with_retry, transient_errors
from saga.broker.transport import BrokerConfig, Topology
from saga.db.connections import DIRECT, DatabaseAccess
from saga.db.sql import validate_schema
from saga.errors import ConfigurationError
from saga.faults import fault_point
from saga.messaging.leases import DEFAULT_LEASE
from saga.messaging.outbox import wake_channel
from saga.messaging.signing import KeyRing
from saga.observability.metrics import Metrics
from saga.observability.redaction import password_of, redact_text, redact_url
from saga.operations.retention import Pruner, RetentionPolicy
from saga.outbox_relay.claims import OutboxRow, RelayStore, check_durability
from saga.outbox_relay.publisher import BatchPublisher, PublishOutcome
from saga.outbox_relay.sweep_floor import SweepFloor

logger = logging.getLogger(__name__)

#: Seconds a relay woken by a NOTIFY may go without the probe that notes where its sweeps
#: start (:mod:`outbox_relay.sweep_floor`); past them, it probes all the same.
NOTE_EVERY = 1.0


@dataclass(frozen=True, slots=True)
class RelayOptions:
    """Tuning knobs of one relay (defaults suit most deployments)."""

    schema: str = "saga"
    batch_size: int = 500
    max_publish_attempts: int = 5
    retry_base_delay: float = 1.0
    #: The wait after a batch that did not fill (and the first after one that found
    #: nothing, doubling up to ``idle_poll_max``); a ``NOTIFY`` ends any wait early.
    idle_poll_min: float = 0.010
    idle_poll_max: float = 1.0
    promote_interval: float = 0.2
    declare_queues: bool = True
    allow_async_commit: bool = False
    max_broker_message_bytes: int | None = None
    #: Seconds between background retention runs (None: never; use ``saga db prune``).
    prune_interval: float | None = None
    retention: RetentionPolicy | None = None
    #: How long the rows of a batch are the relay's own to publish: past it (the relay
    #: died, or its publish stalled that long) another relay may publish them again.
    lease: timedelta = DEFAULT_LEASE
    #: Sign every message with the ring's newest key (HMAC-SHA256 over the body).
    signing: KeyRing | None = None
    #: Direct or through a transaction-mode pooler; where wake-ups come from.
    database: DatabaseAccess = DIRECT

    def __post_init__(self) -> None:
        validate_schema(self.schema)
        if self.batch_size < 1:
            raise ConfigurationError("batch_size must be at least 1")
        if self.max_publish_attempts < 1:
            raise ConfigurationError("max_publish_attempts must be at least 1")
        if self.lease <= timedelta(0):
            raise ConfigurationError(f"a relay's lease must be positive, not {self.lease}")


@dataclass(frozen=True, slots=True)
class BatchReport:
    """What one batch did."""

    claimed: int
    published: int
    deferred: int
    quarantined: int


class Relay:
    """One relay worker: a database connection, a LISTEN connection (unless it polls) and a
    broker connection."""

    def __init__(
        self,
        database_url: str,
        broker: BrokerConfig,
        options: RelayOptions | None = None,
        topology: Topology | None = None,
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self.database_url = database_url
        self.metrics = metrics
        self.broker = broker
        self.options = options or RelayOptions()
        self.topology = topology or Topology()
        self.store = RelayStore(self.options.schema)
        self.sweep_floor = SweepFloor()
        self.pruner = Pruner(self.options.schema, self.options.retention)
        self._db: psycopg.Connection[Any] | None = None
        self._listen: psycopg.Connection[Any] | None = None
        self._broker_conn: Connection | None = None
        self._publisher: BatchPublisher | None = None
        self._secret = password_of(database_url)
        self.published_total = 0

    def __repr__(self) -> str:
        return f"Relay(database={redact_url(self.database_url)!r}, broker={self.broker!r})"

    # -- lifecycle -----------------------------------------------------------

    def __enter__(self) -> Relay:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def connect(self) -> None:
        """Open the database, LISTEN (unless polling) and broker connections (once; no retry)."""
        self.close()
        access = self.options.database
        try:
            # autocommit: a lone statement (a probe, a promotion) is a transaction of its
            # own; every other runs in an explicit ``transaction()``
            self._db = access.connect(self.database_url, autocommit=True)
            check_durability(self._db, allow_async_commit=self.options.allow_async_commit)
            self._check_prune_privileges(self._db)
            self._listen = access.connect_listener(self.database_url)
            if self._listen is not None:
                self._listen.execute(f"LISTEN {wake_channel(self.options.schema)}")
        except psycopg.OperationalError as exc:
            self.close()
            raise ConnectionError(redact_text(str(exc), self._secret)) from None
        conn = self.broker.connected()
        self._broker_conn = conn
        self.broker.check_connected(conn)
        self._publisher = BatchPublisher(
            conn,
            self.topology,
            declare_queues=self.options.declare_queues,
            max_message_bytes=self.options.max_broker_message_bytes,
            signing=self.options.signing,
        )

    def close(self) -> None:
        if self._publisher is not None:
            self._publisher.close()
        close_quietly(logger, self._broker_conn, self._listen, self._db)
        self._publisher = None
        self._broker_conn = None
        self._listen = None
        self._db = None

    # -- work ----------------------------------------------------------------

    def relay_batch(self, woken: bool = False) -> BatchReport:
        """Lease, publish and settle one batch of ready rows.

        A probe comes first: most polls of a relay below full load find nothing, and then
        cost that one statement (a lease writes, and holds the rows' locks while it runs).
        Not when ``woken`` by a NOTIFY (a writer just committed rows) and a sweep was noted
        within :data:`NOTE_EVERY` seconds: the lease comes at once."""
        db, publisher = self._require()
        floor = self.sweep_floor.floor()
        if not (woken and self.sweep_floor.noted_within(NOTE_EVERY)):
            first_ready, next_id = self.store.probe(db, floor)
            self.sweep_floor.swept(floor, next_id if first_ready is None else first_ready)
            if first_ready is None:
                return BatchReport(0, 0, 0, 0)
        rows = self.store.lease(db, self.options.batch_size, self.options.lease, floor)
        if not rows:  # other relays hold them
            return BatchReport(0, 0, 0, 0)
        fault_point("relay.after_claim")
        try:
            outcome = self._publish(publisher, rows)
        except BaseException:
            self._release(db, rows)
            raise
        fault_point("relay.after_publish")
        if outcome.failed:
            with db.transaction():
                self.store.settle(db, outcome.published, outcome.unrouted)
                deferred, quarantined = self._handle_failures(db, rows, outcome)
        else:
            self.store.settle(db, outcome.published, outcome.unrouted)
            deferred = quarantined = 0
        fault_point("relay.after_commit")
        self.published_total += len(outcome.published)
        if self.metrics is not None:
            self.metrics.published.inc(len(outcome.published))
            self.metrics.publish_failures.inc(len(outcome.failed))
            self.metrics.count_unrouted(outcome.unrouted)
            if quarantined:
                self.metrics.dead_lettered.labels("outbox_relay", "unpublishable").inc(quarantined)
        return BatchReport(len(rows), len(outcome.published), deferred, quarantined)

    def _release(self, db: psycopg.Connection[Any], rows: list[OutboxRow]) -> None:
        """Hand back the rows of a batch whose publish failed (nothing is known of it), for
        this relay once it has reconnected, or another, rather than when their lease ends;
        with the database gone too, the lease's end releases them."""
        try:
            self.store.release(db, [row.id for row in rows])
        except psycopg.Error:
            logger.debug("releasing %d leased row(s) failed", len(rows), exc_info=True)

    def promote_due(self) -> int:
        """Release scheduled rows whose ``deliver_after`` has passed."""
        db, _ = self._require()
        promoted = self.store.promote_due(db)  # one statement: a transaction of its own
        if promoted:
            self.sweep_floor.rescan()
        return promoted

    def drain(self) -> int:
        """Relay until nothing is ready (tests and one-shot runs); return rows published."""
        total = 0
        self.sweep_floor.rescan()
        self.promote_due()
        while True:
            report = self.relay_batch()
            total += report.published
            if report.claimed == 0:
                return total

    def run(self, stop: threading.Event) -> None:
        """Relay until ``stop`` is set, reconnecting after database or broker loss."""
        while not stop.is_set():
            try:
                self._connect_with_retry(stop)
                if stop.is_set():
                    break
                logger.info("relay connected: %r", self)
                self._loop(stop)
            except self._transient_errors() as exc:
                logger.warning(
                    "relay lost a connection, reconnecting: %s",
                    redact_text(str(exc), self._secret),
                )
                self.close()
                stop.wait(0.5)
            finally:
                if stop.is_set():
                    self.close()
        logger.info("relay stopped after publishing %d messages", self.published_total)

    def _loop(self, stop: threading.Event) -> None:
        idle = self.options.idle_poll_min
        last_promote = 0.0
        last_prune = last_heartbeat = time.monotonic()
        woken = False
        while not stop.is_set():
            # the batch first: a wake-up's rows leave before any housekeeping
            report = self.relay_batch(woken)
            woken = False
            now = time.monotonic()
            promoted = 0
            if now - last_promote >= self.options.promote_interval:
                promoted = self.promote_due()
                last_promote = now
            interval = self.options.prune_interval
            if interval is not None and now - last_prune >= interval:
                self._prune_a_little()
                last_prune = now
            if now - last_heartbeat >= 1.0:
                self._heartbeat()
                last_heartbeat = now
            if report.claimed or promoted:
                idle = self.options.idle_poll_min
                if report.claimed < self.options.batch_size and not promoted:
                    woken = self._wait(stop, idle)  # drained: a poll now finds nothing
                continue
            self._heartbeat()
            woken = self._wait(stop, idle)
            idle = min(idle * 2, self.options.idle_poll_max)

    def _check_prune_privileges(self, db: psycopg.Connection[Any]) -> None:
        """Background pruning deletes from tables the relay role is not granted: refuse
        to start without them rather than fail at the first prune."""
        if self.options.prune_interval is None:
            return
        missing = self.pruner.missing_privileges(db)
        if missing:
            self.close()
            raise ConfigurationError(
                f"the relay cannot prune (--prune-interval): its role lacks {', '.join(missing)}. "
                "Prune as the operator role instead (saga db prune, on a schedule), or run "
                "this relay under a role granted those privileges."
            )

    def _prune_a_little(self) -> None:
        """A few retention batches between relay batches (background pruning)."""
        db, _ = self._require()
        report = self.pruner.prune(db, max_batches=4)
        if report.total:
            logger.info("pruned %s", report.deleted)

    def _wait(self, stop: threading.Event, seconds: float) -> bool:
        """Wait ``seconds``, or less if a ``NOTIFY`` comes (then True) or ``stop`` is set.

        The LISTEN socket is polled here in whole milliseconds, rounded up: psycopg's own
        wait rounds down and would spin through the last millisecond of every wait."""
        listen = self._listen
        if listen is None:  # polling only
            stop.wait(seconds)
            return False
        poller = select.poll()
        poller.register(listen.fileno(), select.POLLIN)
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if poller.poll(math.ceil(min(remaining, 0.25) * 1000)):
                for _ in listen.notifies(timeout=0, stop_after=1):
                    return True
        return False

    def _heartbeat(self) -> None:
        """Read what the broker sent (its heartbeats) and send ours when due.

        A publisher never consumes, so without this read the server's heartbeats
        pile up unread and the client believes the broker went silent.
        """
        conn = self._broker_conn
        if conn is None or not self.broker.capabilities.heartbeats:
            return
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0)
        conn.heartbeat_check()

    def _publish(self, publisher: BatchPublisher, rows: list[OutboxRow]) -> PublishOutcome:
        try:
            return publisher.publish(rows)
        except self._channel_errors() as exc:
            # A channel-level refusal: find the rows responsible, one at a time.
            logger.warning("batch publish refused (%s); isolating rows", exc)
            publisher.close()
            outcome = PublishOutcome()
            for row in rows:
                try:
                    single = publisher.publish([row])
                except self._channel_errors() as row_exc:
                    publisher.close()
                    outcome.failed[row.id] = (type(row_exc).__name__, str(row_exc))
                    continue
                outcome.add(single)
            return outcome

    def _handle_failures(
        self, db: psycopg.Connection[Any], rows: list[OutboxRow], outcome: PublishOutcome
    ) -> tuple[int, int]:
        deferred = quarantined = 0
        by_id = {row.id: row for row in rows}
        for row_id, (error_type, message) in outcome.failed.items():
            row = by_id[row_id]
            attempts = row.attempts + 1
            extra = {"message_id": str(row.message_id), "destination": row.destination}
            if attempts >= self.options.max_publish_attempts or row_id in outcome.permanent:
                logger.error(
                    "quarantining message %s after %d failed publishes: %s",
                    row.message_id,
                    attempts,
                    message,
                    extra=extra,
                )
                self.store.quarantine(db, row_id, error_type, message)
                quarantined += 1
            else:
                delay = timedelta(seconds=self.options.retry_base_delay * 2 ** (attempts - 1))
                logger.warning(
                    "publish of message %s failed (attempt %d), retrying in %s: %s",
                    row.message_id,
                    attempts,
                    delay,
                    message,
                    extra=extra,
                )
                self.store.defer(db, row_id, f"{error_type}: {message}", delay)
                deferred += 1
        return deferred, quarantined

    # -- helpers -------------------------------------------------------------

    def _require(self) -> tuple[psycopg.Connection[Any], BatchPublisher]:
        if self._db is None or self._publisher is None:
            raise RuntimeError("relay is not connected; call connect() or use it as a context")
        return self._db, self._publisher

    def _connect_with_retry(self, stop: threading.Event) -> None:
        connect_with_retry(self.connect, self._transient_errors(), stop, logger)

    def _transient_errors(self) -> tuple[type[BaseException], ...]:
        return transient_errors(self._broker_conn or self.broker.connect())

    def _channel_errors(self) -> tuple[type[BaseException], ...]:
        conn = self._broker_conn
        if conn is None:
            return ()
        connection_errors = tuple(conn.connection_errors)
        return tuple(e for e in conn.channel_errors if not issubclass(e, connection_errors))
