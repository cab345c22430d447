"""kombu's Redis transport, made to keep every message through a Redis restart or a crash.

kombu consumes with ``BRPOP``: Redis takes the message off the queue's list, and only
when the reply reaches the consumer does kombu record it as unacknowledged (the
``unacked`` hash, from which a dead consumer's messages come back after the visibility
timeout). A message that Redis popped, and even wrote to its append-only file, whose
reply never arrived (Redis killed, a connection dropped, the consumer killed) is in
neither place: lost, on a Redis that persists every write.

Here a consumer takes a message with ``BLMOVE queue processing RIGHT LEFT``: Redis moves
it, atomically and persistently, onto the consumer's own *processing list*. Recording it
in ``unacked`` and removing it from that list happen in one ``MULTI``, retried through a
Redis restart (up to :data:`RECORD_PATIENCE` seconds). So a message is always in its
queue, in a processing list or in ``unacked``.

A processing list belongs to one consumer connection (a random id). It is registered in
the :data:`REGISTRY` hash (list -> queue) beside a heartbeat key that expires after the
visibility timeout. Consuming channels refresh their heartbeat while they poll and, when
they (re)connect and every few seconds, sweep: every registered list whose heartbeat has
expired goes back to its queue (one Lua script). A channel whose connection broke takes
a new id, so what Redis moved into its old list is swept back too. kombu's ack, reject,
requeue and visibility-timeout restore (all on ``unacked``) are unchanged.

The atomic take needs Redis 6.2 or later, a channel consuming one queue, one priority
step and no global key prefix: the framework's use (its default exchange, one queue per
service, no priorities). Otherwise kombu's ``BRPOP`` is used.
"""

from __future__ import annotations

import logging
import uuid
from queue import Empty
from time import monotonic, time
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
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
#: Hash: each consumer's processing list -> the queue its messages came from.
REGISTRY = "_saga.processing"
#: A consumer's processing list is this prefix and its id; its heartbeat adds ALIVE.
PROCESSING_PREFIX = "_saga.processing."
ALIVE = ".alive"
#: Seconds between a consumer's heartbeats (and sweeps), at most.
HEARTBEAT_EVERY = 5.0

# KEYS: the registry, the caller's processing list, its heartbeat key.
# ARGV: the caller's queue, heartbeat lifetime (ms), the heartbeat suffix.
_HEARTBEAT_AND_SWEEP = """
redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
redis.call('HSET', KEYS[1], KEYS[2], ARGV[1])
local restored = 0
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local list, queue = entries[i], entries[i + 1]
  if redis.call('EXISTS', list .. ARGV[3]) == 0 then
    while redis.call('LMOVE', list, queue, 'RIGHT', 'RIGHT') do
      restored = restored + 1
    end
    redis.call('HDEL', KEYS[1], list)
  end
end
return restored
"""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


class QoS(kombu_redis.QoS):  # type: ignore[misc]
    def append(self, message: Any, delivery_tag: Any) -> None:
        """Record ``message`` as unacknowledged (and off its processing list), through a restart."""
        transport = self.channel.connection
        taken = getattr(transport, "taken", None)
        for attempt in Retrying(
            retry=retry_if_exception_type(tuple(self.channel.connection_errors)),
            wait=wait_exponential(multiplier=0.05, max=2.0),
            stop=stop_after_delay(RECORD_PATIENCE),
            before_sleep=before_sleep_log(logger, logging.WARNING),
            reraise=True,
        ):
            with attempt:
                self._record(message, delivery_tag, taken)
        if taken is not None:
            transport.taken = None
        virtual.QoS.append(self, message, delivery_tag)

    def _record(self, message: Any, delivery_tag: Any, taken: tuple[str, bytes] | None) -> None:
        delivery = message.delivery_info
        raw = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        with self.channel.conn_or_acquire() as client:
            pipe = client.pipeline()  # MULTI ... EXEC
            pipe.zadd(self.unacked_index_key, {delivery_tag: time()})
            pipe.hset(self.unacked_key, delivery_tag, raw)
            if taken is not None:
                pipe.lrem(taken[0], 1, taken[1])
            pipe.execute()


class Channel(kombu_redis.Channel):  # type: ignore[misc]
    QoS = QoS
    #: One list per queue (kombu's default adds three priority lists), so BLMOVE can take.
    priority_steps = [0]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._consumer_id = uuid.uuid4().hex
        self._taking_from: str | None = None
        self._atomic: bool | None = None
        self._alive_id: str | None = None
        self._alive_at = float("-inf")
        super().__init__(*args, **kwargs)

    @property
    def processing_key(self) -> str:
        return PROCESSING_PREFIX + self._consumer_id

    @property
    def heartbeat_lifetime(self) -> float:
        """The visibility timeout, and well above a blocking take."""
        return max(float(self.visibility_timeout), 4.0 * self._take_timeout)

    @property
    def _take_timeout(self) -> float:
        return float(self.brpop_timeout or 1)  # never 0 (forever): the sweep relies on it

    def _brpop_start(self, timeout: float | None = None) -> None:
        queues = self.active_queues
        if not self._takes_atomically(queues):
            super()._brpop_start(timeout)
            return
        queue = self._q_for_pri(queues[0], self.priority_steps[0])
        self._keep_alive(queue)
        self._in_poll = self.client.connection
        self._brpop_sent_at = monotonic()
        self._taking_from = queues[0]
        self.client.connection.send_command(
            "BLMOVE", queue, self.processing_key, "RIGHT", "LEFT", timeout or self._take_timeout
        )

    def _brpop_read(self, **options: Any) -> bool:
        queue = self._taking_from
        if queue is None:
            return bool(super()._brpop_read(**options))
        try:
            try:
                item = self.client.parse_response(self.client.connection, "BLMOVE", **options)
            except self.connection_errors:
                self.client.connection.disconnect()  # retires this id: see below
                raise
            if item is None:
                raise Empty()
            self._queue_cycle.rotate(queue)
            self.connection.taken = (self.processing_key, item)
            try:
                self.connection._deliver(loads(bytes_to_str(item)), queue)
            finally:
                if self.connection.taken is not None:  # not recorded: the sweep returns it
                    self.connection.taken = None
                    self._retire_id()
            return True
        finally:
            self._in_poll = None
            self._taking_from = None
            self._flush_brpop_reauth()

    def _on_connection_disconnect(self, connection: Any) -> None:
        if self._taking_from is not None and self._in_poll is connection:
            # Redis may have moved a message for a reply this connection will never
            # read: leave that list to the sweep, and take into a new one.
            self._retire_id()
            self._taking_from = None
        super()._on_connection_disconnect(connection)

    def _retire_id(self) -> None:
        self._consumer_id = uuid.uuid4().hex

    def _takes_atomically(self, queues: list[str]) -> bool:
        if len(queues) != 1 or len(self.priority_steps) != 1 or self.global_keyprefix:
            return False
        if self._atomic is None:
            try:
                with self.conn_or_acquire() as client:
                    server = str(client.info("server").get("redis_version", "0"))
            except self.ResponseError:  # INFO disabled: the version is unknown
                server = "(version unknown)"
            self._atomic = _version(server) >= (6, 2)
            if not self._atomic:
                logger.warning(
                    "Redis %s has no BLMOVE (6.2+): consuming with BRPOP, which loses a "
                    "message Redis took if Redis or the consumer dies before it arrives",
                    server,
                )
        return self._atomic

    def _keep_alive(self, queue: str) -> None:
        """Heartbeat for this consumer's processing list; return dead consumers' lists."""
        now = monotonic()
        every = min(HEARTBEAT_EVERY, self.heartbeat_lifetime / 4)
        if self._alive_id == self._consumer_id and now - self._alive_at < every:
            return
        key = self.processing_key
        with self.conn_or_acquire() as client:
            restored = client.register_script(_HEARTBEAT_AND_SWEEP)(
                keys=[REGISTRY, key, key + ALIVE],
                args=[queue, int(self.heartbeat_lifetime * 1000), ALIVE],
                client=client,
            )
        self._alive_id, self._alive_at = self._consumer_id, now
        if restored:
            logger.warning(
                "returned %d message(s) taken by consumers that are gone to their queues",
                restored,
            )


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel
    #: A message just taken, handed to whichever channel's QoS records it.
    taken: tuple[str, bytes] | None = None
