"""PostgreSQL as the broker: a kombu virtual transport over one message table with leases.

``SAGA_BROKER_URL=postgresql://...`` (or ``postgres://``) selects it; any database will
do, a dedicated one or a service's own. The transport creates its schema (``saga_broker``
unless the ``schema`` transport option says otherwise) on first connect, under an
advisory lock, so no migration has to run first.

The table holds one row per message: ``queue``, ``body``, ``headers``, ``properties``,
``visible_at``, ``lock_token``, ``attempts``. The unacknowledged state lives in the table,
not in the consumer's memory:

- **take**: a batch is claimed with ``FOR UPDATE SKIP LOCKED``; the claim sets
  ``visible_at = now() + lease``, a fresh ``lock_token`` and ``attempts + 1``. A row
  whose ``visible_at`` is in the future is in flight (or delayed): nobody else takes it.
- **ack**: ``DELETE`` fenced by the token (a consumer whose lease ran out cannot delete
  what another now holds), batched: acks collect in memory and go in one statement
  before the channel's next take, or when it closes.
- **nack / requeue**: the row's lease is released (``visible_at = now() + delay``).
- **renewal**: while a channel holds messages, a thread renews their lease every third
  of it, so a long batch keeps them; a consumer that dies stops renewing, and its
  messages come back when the lease ends.
- **delay**: a message published with an ``x-delay`` header (milliseconds) is inserted
  with ``visible_at`` that far ahead.
- **events**: a publish to an exchange (the events exchange) makes one row per queue
  bound to its routing key, in the same INSERT, from the ``subscriptions`` table
  (``exchange``, ``routing_key``, ``queue``): bindings are rows, durable and shared by
  every process, never kept in one process's memory. ``queue_bind`` adds a row,
  ``queue_unbind`` and ``queue_delete`` remove them. A publish that matches no binding is
  handed to the producer's ``on_return`` callback, as RabbitMQ returns a ``mandatory``
  message it cannot route.
- **wake-ups**: a publisher sends ``NOTIFY`` after its insert committed (never inside it,
  so writers do not serialize on the notification lock), at most once per queue per
  :data:`WAKE_INTERVAL`; consumers ``LISTEN`` and otherwise poll, backing off from
  :data:`MIN_POLL` to :data:`MAX_POLL`. ``listen=False`` (transport option) polls only,
  for poolers that cannot ``LISTEN``.
- **poolers**: ``pooled=True`` (transport option: the database is behind a pooler in
  transaction mode) opens connections without prepared statements and, instead of the
  session's ``SET synchronous_commit = on`` (which would stay behind on a server
  connection other clients then get), refuses a database whose commits are not durable.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from queue import Empty
from time import monotonic
from typing import Any

import psycopg
from kombu.transport import virtual
from psycopg import sql

from saga.broker.postgres.low_water import LowWaterMarks
from saga.broker.postgres.messages import (
    claim_parameters,
    claim_statement,
    create_messages,
    layout_is_current,
)
from saga.broker.postgres.publishing import (
    DEFAULT_EXCHANGE,
    SUBSCRIPTIONS_DDL,
    Bindings,
    Outgoing,
    PublishBatch,
    ReturnedMessage,
    columns_of,
)
from saga.broker.postgres.rotation import ROTATE_INTERVAL, Rotation
from saga.broker.postgres.settling import (
    DELETE,
    RELEASE,
    Delivery,
    delivery_of,
    delivery_tag,
    settle,
)
from saga.db.connections import DIRECT, POOLED_POLLING
from saga.db.sql import validate_name
from saga.db.vacuum_horizon import read_vacuum_horizon, warn_if_held
from saga.errors import UnsafeDurability
from saga.observability.redaction import redact_url

logger = logging.getLogger(__name__)

DEFAULT_SCHEMA = "saga_broker"
#: Seconds a claimed message stays invisible to others unless its consumer renews it.
DEFAULT_LEASE = 30.0
#: Publishers notify a queue at most once per this many seconds.
WAKE_INTERVAL = 0.005
#: Poll interval of an idle consumer: from MIN_POLL, doubling to MAX_POLL (seconds).
MIN_POLL = 0.005
MAX_POLL = 1.0
#: Messages a channel claims at once when no prefetch limit is set.
DEFAULT_BATCH = 100
#: Acks waiting for their DELETE are flushed at this many even before the next take.
MAX_PENDING_ACKS = 1000
#: A consuming channel vacuums the messages table this often (seconds; 0: never).
VACUUM_INTERVAL = 10.0
#: A transaction holding back vacuum is logged at most this often (seconds).
WARN_EVERY = 60.0


def wake_channel(schema: str) -> str:
    """The ``LISTEN`` channel of a broker schema."""
    return f"{schema}_wake"


#: The session settings of a direct connection to the broker's database (behind a
#: transaction pooler none would stick), sent in one statement.
_DIRECT_SETTINGS = (
    # A broker row must be on disk when the relay deletes its outbox row.
    "synchronous_commit = on",
    # A claim must walk its queue's index in order and stop at its limit. With a floor and
    # now() as bounds, the planner guesses few rows and may prefer a bitmap scan that
    # reads and sorts the whole backlog (raw msg/s halved).
    "enable_bitmapscan = off",
    # Every statement of the broker reads its messages through an index (the claim's walk,
    # the ack's ids). A prepared statement's plan is made once, and made while a partition
    # of the ring was empty, a scan of it whole was the cheapest: kept while the partition
    # fills (until its next vacuum or truncation), claims and acks would read every
    # message of their generation. Planning each statement afresh instead adds a third to
    # the claim's own work.
    "enable_seqscan = off",
    # With scans priced out, each statement looks costly enough to be compiled (200 ms
    # for an INSERT of 100 messages).
    "jit = off",
    # And the plans are kept: left to choose, PostgreSQL plans every claim afresh (0.39 ms
    # for its three partition arms, a tenth of the consumer's backend CPU).
    "plan_cache_mode = force_generic_plan",
)


class QoS(virtual.QoS):  # type: ignore[misc]
    """Prefetch accounting in memory; acks, rejects and restores go to the table."""

    def ack(self, delivery_tag: str) -> None:
        self.channel.settle([delivery_tag], delete=True)
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        # requeue: released at once (or after the channel's requeue delay); otherwise dropped.
        self.channel.settle([delivery_tag], delete=not requeue)
        self._quick_ack(delivery_tag)

    def restore_unacked(self) -> list[Any]:
        """Release every lease this channel still holds (a channel that closes)."""
        self._flush()
        tags = list(self._delivered)
        self._delivered.clear()
        try:
            self.channel.settle(tags, delete=False)
        except Exception as exc:  # the connection is gone: the leases simply run out
            logger.info("could not release %d lease(s) (%s); they expire", len(tags), exc)
        return []


class Channel(virtual.Channel):  # type: ignore[misc]
    QoS = QoS
    body_encoding = None  # bytes go to a bytea column as they are
    supports_batch_publish = True
    from_transport_options = (
        *virtual.Channel.from_transport_options,
        "schema",
        "lease",
        "requeue_delay",
        "vacuum_interval",
        "rotate_interval",
    )
    schema = DEFAULT_SCHEMA
    lease = DEFAULT_LEASE
    requeue_delay = 0.0
    vacuum_interval = VACUUM_INTERVAL
    rotate_interval = ROTATE_INTERVAL

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        validate_name(self.schema, "broker schema")
        self.table = sql.Identifier(self.schema, "messages")
        self._claim = claim_statement(self.schema)  # composed once: 40 µs a claim otherwise
        self.bindings = Bindings(self.schema)
        #: ``basic_return``: the callbacks of producers told of messages nothing routed.
        self.events: dict[str, set[Callable[..., Any]]] = defaultdict(set)
        self.db = connection.connect_db()
        connection.ensure_schema(self.db, self.schema)
        self._pending_acks: list[Delivery] = []
        self.low_water = LowWaterMarks()
        self.rotation = Rotation(self.schema, self.rotate_interval)
        self._next_warning = 0.0
        self._last_vacuum = float("-inf")
        self._held: dict[str, int] = {}  # lock token -> messages of its claim not yet settled
        self._held_lock = threading.Lock()
        self._renewer: threading.Thread | None = None
        self._stop_renewing = threading.Event()

    # -- publishing ----------------------------------------------------------

    def create_publish_batch(self, max_size: int) -> PublishBatch:
        return PublishBatch(self, max_size)

    def basic_publish(
        self, message: dict[str, Any], exchange: str, routing_key: str, **kwargs: Any
    ) -> None:
        """A message for a queue (no exchange), or for every queue bound to ``routing_key``
        on ``exchange`` (the routing happens in the INSERT, from the subscriptions table)."""
        if not exchange:
            super().basic_publish(message, exchange, routing_key, **kwargs)
            return
        self._inplace_augment_message(message, exchange, routing_key)
        self._send((exchange, routing_key, message), kwargs.pop("_publish_batch", None))

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self._send(("", queue, message), kwargs.pop("_publish_batch", None))

    def _send(self, row: Outgoing, batch: PublishBatch | None) -> None:
        if batch is not None:
            batch.add(row)
        else:
            self.insert([row])

    def insert(self, rows: Sequence[Outgoing]) -> None:
        """Insert messages in one statement (one commit), then wake their consumers; a
        message sent to an exchange that no queue is bound to goes to ``basic_return``."""
        columns = columns_of(rows)
        queues, unrouted = self.bindings.insert(self.db, columns)
        self.connection.notify(self.db, self.schema, queues)
        for n in unrouted:
            self._return(*rows[n], columns[2][n])

    def _return(
        self, exchange: str, routing_key: str, message: dict[str, Any], body: bytes
    ) -> None:
        """Tell the producers that nothing is bound to ``routing_key`` on ``exchange``."""
        callbacks = self.events["basic_return"]
        if not callbacks:
            logger.debug("no queue bound to %r on %r: message dropped", routing_key, exchange)
        returned = ReturnedMessage(dict(message.get("properties") or {}), body)
        reason = f"NO_ROUTE - no queue bound to {routing_key!r} on {exchange!r}"
        for callback in list(callbacks):
            callback(LookupError(reason), exchange, routing_key, returned)

    # -- bindings --------------------------------------------------------------

    def queue_bind(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        arguments: Any = None,
        **kwargs: Any,
    ) -> None:
        """Bind ``queue`` to ``routing_key`` on ``exchange``: a row, kept by the broker."""
        self.bindings.bind(self.db, exchange or DEFAULT_EXCHANGE, routing_key, queue)

    def queue_unbind(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        arguments: Any = None,
        **kwargs: Any,
    ) -> None:
        self.bindings.unbind(self.db, exchange or DEFAULT_EXCHANGE, routing_key, queue)

    # -- consuming -----------------------------------------------------------

    def drain_events(self, timeout: float | None = None, callback: Any = None) -> None:
        self.flush_acks()
        if not (self._consumers and self.qos.can_consume()):
            raise Empty()
        limit = self.qos.can_consume_max_estimate() or DEFAULT_BATCH
        deliver = callback or self.connection._deliver
        taken = self.claim(self._active_queues, limit)
        if not taken:
            raise Empty()
        for payload, queue in taken:
            deliver(payload, queue)

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        self.flush_acks()
        taken = self.claim([queue], 1)
        if not taken:
            raise Empty()
        return taken[0][0]

    def claim(self, queues: Sequence[str], limit: int) -> list[tuple[dict[str, Any], str]]:
        """Take up to ``limit`` visible messages of ``queues`` under a fresh lease."""
        if not queues or limit <= 0:
            return []
        token = uuid.uuid4()
        scan = self.low_water.floors(queues)
        rows = self.db.execute(*self._claim_query(queues, scan.floors, limit, token)).fetchall()
        now = next(row[-1] for row in rows if row[0] is None)
        rows = [row for row in rows if row[0] is not None]
        self.low_water.advance(queues, scan, limit, ((row[1], row[6]) for row in rows), now)
        if not rows:
            return []
        with self._held_lock:
            self._held[str(token)] = len(rows)
        self._start_renewing()
        taken = []
        tag_token = str(token)
        for row_id, queue, body, headers, stored, attempts, _, generation, _ in sorted(rows):
            props = dict(stored)
            content_type = props.pop("content-type", None)
            content_encoding = props.pop("content-encoding", None)
            props["delivery_tag"] = delivery_tag(row_id, tag_token, generation)
            props.setdefault("delivery_info", {})
            payload = {
                "body": bytes(body),
                "content-type": content_type,
                "content-encoding": content_encoding,
                "headers": headers,
                "properties": props,
                "redelivered": attempts > 1,
            }
            taken.append((payload, queue))
        return taken

    def claim_query(
        self, queues: Sequence[str], limit: int, token: uuid.UUID
    ) -> tuple[sql.Composed, tuple[Any, ...]]:
        """The statement (and its parameters) this channel's next claim would run."""
        return self._claim_query(queues, self.low_water.floors(queues).floors, limit, token)

    def _claim_query(
        self,
        queues: Sequence[str],
        floors: Sequence[datetime | None],
        limit: int,
        token: uuid.UUID,
    ) -> tuple[sql.Composed, tuple[Any, ...]]:
        return self._claim, claim_parameters(queues, floors, limit, self.lease, token)

    # -- settling ------------------------------------------------------------

    def settle(self, delivery_tags: Iterable[str], *, delete: bool, delay: float = 0.0) -> None:
        """Acknowledge (``delete``: batched) or release (at once) the given deliveries."""
        deliveries = [delivery_of(tag) for tag in delivery_tags]
        if not deliveries:
            return
        with self._held_lock:
            for _, token, _ in deliveries:
                left = self._held.get(token, 0) - 1
                if left > 0:
                    self._held[token] = left
                else:
                    self._held.pop(token, None)
        if delete:
            self._pending_acks.extend(deliveries)
            if len(self._pending_acks) >= MAX_PENDING_ACKS:
                self.flush_acks()
            return
        settle(self.db, self.schema, RELEASE, deliveries, (delay or self.requeue_delay,))

    def nack(self, delivery_tag: str, delay: float) -> None:
        """Give a delivery back, to be delivered again after ``delay`` seconds."""
        self.settle([delivery_tag], delete=False, delay=delay)
        self.qos._quick_ack(delivery_tag)

    def flush_acks(self) -> None:
        """Delete the acknowledged messages, fenced by their lock tokens (one statement
        per generation they were taken from, and one for those the rotation moved)."""
        deliveries, self._pending_acks = self._pending_acks, []
        if not deliveries:
            return
        try:
            settle(self.db, self.schema, DELETE, deliveries)
        except BaseException:
            # Not known to be deleted: tried again (a delete done already matches nothing),
            # or their lease ends.
            self._pending_acks[:0] = deliveries
            raise

    # -- leases --------------------------------------------------------------

    def _start_renewing(self) -> None:
        if self._renewer is None or not self._renewer.is_alive():
            self._renewer = threading.Thread(
                target=self._renew_loop, name="saga-broker-lease", daemon=True
            )
            self._renewer.start()

    def _renew_loop(self) -> None:
        """Renew the leases held (every third of a lease), rotate the table's generations
        and vacuum it now and then, on a connection of its own: the consuming connection
        never waits for any of them."""
        db: psycopg.Connection[Any] | None = None
        vacuumed = rotated = monotonic()
        pause = min(
            [self.lease / 3, *(i for i in (self.vacuum_interval, self.rotate_interval) if i)]
        )
        try:
            while not self._stop_renewing.wait(pause):
                with self._held_lock:
                    tokens = list(self._held)
                clock = monotonic()
                vacuum = bool(self.vacuum_interval) and clock - vacuumed >= self.vacuum_interval
                rotate = bool(self.rotate_interval) and clock - rotated >= self.rotate_interval
                if not (tokens or vacuum or rotate):
                    continue
                try:
                    if db is None or db.closed:
                        db = self.connection.connect_db()
                    if tokens:
                        self.renew(db, tokens)
                    if rotate:
                        rotated = monotonic()
                        self.rotation.run(db)
                    if vacuum:
                        vacuumed = monotonic()
                        self.vacuum(db)
                except psycopg.Error as exc:
                    logger.warning("lease renewal, rotation or vacuum failed: %s", exc)
                    db = None
        finally:
            if db is not None:
                db.close()

    def vacuum(self, db: psycopg.Connection[Any]) -> None:
        """Reclaim the rows of messages gone: each lives for milliseconds and leaves dead
        tuples behind (its claim, its delete), far faster than autovacuum's default pace
        expects. ``SKIP_LOCKED``: when another consumer is vacuuming, this one does not wait.

        While a transaction that began before the last pass is still open, another pass
        could reclaim nothing the last one did not, and would read the whole (growing)
        table for nothing: it waits. Such a transaction is logged past its threshold (at
        most every WARN_EVERY s).
        """
        horizon = read_vacuum_horizon(db, [self.schema])
        if monotonic() >= self._next_warning and warn_if_held(
            horizon, "PostgreSQL broker's database"
        ):
            self._next_warning = monotonic() + WARN_EVERY
        held = horizon.oldest
        since_last = monotonic() - self._last_vacuum
        if held is not None and held.age_s is not None and held.age_s > since_last:
            return
        db.execute(sql.SQL("VACUUM (SKIP_LOCKED) {}").format(self.table))
        self._last_vacuum = monotonic()

    def renew(self, db: psycopg.Connection[Any], tokens: list[str]) -> int:
        """Push the lease of every message held under ``tokens`` one lease ahead."""
        cursor = db.execute(
            sql.SQL(
                "UPDATE {t} SET visible_at = now() + %s * interval '1 second' "
                "WHERE lock_token = ANY(%b::uuid[])"
            ).format(t=self.table),
            (self.lease, tokens),
        )
        return cursor.rowcount

    # -- queues --------------------------------------------------------------

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        """Queues are implicit: a queue is the rows that name it."""

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return True

    def _size(self, queue: str) -> int:
        self.flush_acks()
        row = self.db.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE queue = %s AND visible_at <= now()").format(
                self.table
            ),
            (queue,),
        ).fetchone()
        return int(row[0]) if row else 0

    def _purge(self, queue: str) -> int:
        self.flush_acks()
        cursor = self.db.execute(
            sql.SQL("DELETE FROM {} WHERE queue = %s AND visible_at <= now()").format(self.table),
            (queue,),
        )
        return cursor.rowcount

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        """Delete the queue: its messages and its bindings."""
        self.db.execute(sql.SQL("DELETE FROM {} WHERE queue = %s").format(self.table), (queue,))
        self.bindings.unbind_queue(self.db, queue)

    def queue_delete(
        self, queue: str, if_unused: bool = False, if_empty: bool = False, **kw: Any
    ) -> None:
        if if_empty and self._size(queue):
            return
        self._delete(queue)

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush_acks()
        except Exception as exc:
            logger.info("acks not flushed at close (%s): those messages come back", exc)
        super().close()  # releases the leases still held
        self._stop_renewing.set()
        self.db.close()


class Transport(virtual.Transport):  # type: ignore[misc]
    Channel = Channel
    can_parse_url = True
    driver_type = "postgresql"
    driver_name = "psycopg"
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct"]), heartbeats=False
    )
    connection_errors = (
        *virtual.Transport.connection_errors,
        psycopg.OperationalError,
        psycopg.InterfaceError,
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        options = client.transport_options
        self.listen = bool(options.get("listen", True))
        self.pooled = bool(options.get("pooled", False))
        self.max_poll = float(options.get("max_poll", MAX_POLL))
        self._poll = MIN_POLL
        self._listener: psycopg.Connection[Any] | None = None
        self._listening_schemas: set[str] = set()
        self._notified: dict[tuple[str, str], float] = {}
        self._schemas_ready: set[str] = set()

    def driver_version(self) -> str:
        return str(psycopg.__version__)

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        return uri if include_password else redact_url(uri)

    @property
    def url(self) -> str:
        return str(self.client.hostname)

    def connect_db(self) -> psycopg.Connection[Any]:
        access = POOLED_POLLING if self.pooled else DIRECT
        db = access.connect(
            self.url, autocommit=True, connect_timeout=int(self.client.connect_timeout or 10)
        )
        if not self.pooled:
            db.execute("; ".join(f"SET {setting}" for setting in _DIRECT_SETTINGS))
            return db
        setting = db.execute("SELECT current_setting('synchronous_commit')").fetchone()
        if setting is None or setting[0] == "off":
            db.close()
            raise UnsafeDurability(
                "the PostgreSQL broker's database commits with synchronous_commit off, and "
                "behind a transaction pooler no session SET can turn it on: "
                "ALTER DATABASE ... SET synchronous_commit = on"
            )
        return db

    def ensure_schema(self, db: psycopg.Connection[Any], schema: str) -> None:
        if schema in self._schemas_ready:
            return
        subscriptions = db.execute(
            "SELECT to_regclass(%s)", (f"{schema}.subscriptions",)
        ).fetchone()
        if not (subscriptions and subscriptions[0] and layout_is_current(db, schema)):
            with db.transaction():
                db.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (schema,))
                create_messages(db, schema)
                db.execute(
                    sql.SQL(SUBSCRIPTIONS_DDL).format(
                        subscriptions=sql.Identifier(schema, "subscriptions")
                    )
                )
        self._schemas_ready.add(schema)

    # -- wake-ups ------------------------------------------------------------

    def notify(self, db: psycopg.Connection[Any], schema: str, queues: Iterable[str]) -> None:
        """Wake the consumers of ``queues``: after the commit, at most once per WAKE_INTERVAL."""
        now = monotonic()
        due = []
        for queue in set(queues):
            key = (schema, queue)
            if now - self._notified.get(key, float("-inf")) >= WAKE_INTERVAL:
                self._notified[key] = now
                due.append(queue)
        if due:
            db.execute(
                "SELECT pg_notify(%s, q) FROM unnest(%b::text[]) AS q", (wake_channel(schema), due)
            )

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            try:
                self.cycle.get(self._deliver, timeout=0)
            except Empty:
                remaining = None if deadline is None else deadline - monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError() from None
                wait = self._poll if remaining is None else min(self._poll, remaining)
                woken = self._wait(wait)
                self._poll = MIN_POLL if woken else min(self._poll * 2, self.max_poll)
            else:
                self._poll = MIN_POLL
                return

    def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, or less if a consumed queue is notified; True if it was."""
        if not self.listen:
            threading.Event().wait(seconds)
            return False
        listener = self._listen()
        consumed = set(self._callbacks)
        deadline = monotonic() + seconds
        while (left := deadline - monotonic()) > 0:
            for notice in listener.notifies(timeout=left, stop_after=1):
                if notice.payload in consumed:
                    return True
        return False

    def _listen(self) -> psycopg.Connection[Any]:
        if self._listener is None or self._listener.closed:
            self._listener = self.connect_db()
            self._listening_schemas = set()
        schemas = {channel.schema for channel in self.channels}
        for schema in schemas - self._listening_schemas:
            channel = sql.Identifier(wake_channel(schema))
            self._listener.execute(sql.SQL("LISTEN {}").format(channel))
            self._listening_schemas.add(schema)
        return self._listener

    def close_connection(self, connection: Any) -> None:
        try:
            super().close_connection(connection)
        finally:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
