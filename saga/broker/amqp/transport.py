"""RabbitMQ through py-amqp, with fewer system calls per message.

py-amqp reads every frame with ``recv`` calls of exactly the bytes it needs next
(the header, the payload, the end octet): nine system calls for each message
delivered, which is three frames. It writes every published message with a
``sendall`` of its own. On a busy consumer those calls are a large share of each
step's CPU, on both ends of the socket. This transport

- reads ahead: one ``recv`` takes whatever the socket holds (up to
  :data:`READ_AHEAD` bytes), and the frames are then cut from that buffer;
- lets a batch publisher gather the frames of its messages and write them at once
  (:func:`gathered_writes`); a read that waits for an answer from the broker (a
  declare, the batch's publisher confirms) first sends what was gathered;
- does not poll the socket before every publish (:class:`ReadAheadConnection`).

Everything else is kombu's ``pyamqp`` transport, unchanged. ``amqps://`` keeps
py-amqp's SSL transport.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from amqp import connection as amqp_connection
from amqp import transport as amqp_transport
from kombu import Connection
from kombu.transport import pyamqp

#: The most bytes one ``recv`` takes from the socket.
READ_AHEAD = 64 * 1024


class ReadAheadTransport(amqp_transport.TCPTransport):  # type: ignore[misc]
    """py-amqp's TCP transport with a read-ahead buffer and gathered writes."""

    _ahead: bytearray
    _ahead_at: int
    _gathered: list[bytes] | None = None

    # py-amqp's frame reader puts a partly read frame back into ``_read_buffer`` when a
    # read times out: the buffer's unread part stands in for it.
    @property
    def _read_buffer(self) -> bytes:
        return bytes(self._ahead[self._ahead_at :])

    @_read_buffer.setter
    def _read_buffer(self, value: bytes) -> None:
        self._ahead = bytearray(value)
        self._ahead_at = 0

    def _read(
        self, n: int, initial: bool = False, _errnos: tuple[int, ...] = (errno.EAGAIN, errno.EINTR)
    ) -> bytes:
        """``n`` bytes, from the buffer, filled by as few ``recv`` calls as there can be."""
        if self._gathered and self.sock.gettimeout() != 0:
            # About to wait for the broker: it cannot answer what it has not received.
            # (py-amqp also polls without waiting before every publish: no need then.)
            self._send_gathered()
        ahead = self._ahead
        while len(ahead) - self._ahead_at < n:
            try:
                chunk = self._quick_recv(max(READ_AHEAD, n))
            except OSError as exc:
                if exc.errno in _errnos:
                    if initial and self.raise_on_initial_eintr:
                        raise TimeoutError() from None
                    continue
                raise
            if not chunk:
                raise OSError("Server unexpectedly closed connection")
            if self._ahead_at:
                del ahead[: self._ahead_at]
                self._ahead_at = 0
            ahead += chunk
        start = self._ahead_at
        self._ahead_at = start + n
        return bytes(ahead[start : start + n])

    def write(self, s: Any) -> None:
        if self._gathered is not None:
            self._gathered.append(bytes(s))  # py-amqp reuses the buffer it hands over
            return
        super().write(s)

    @contextmanager
    def gathering(self) -> Iterator[None]:
        """Hold the frames written inside the block; send them in one write at its end."""
        self._gathered = []
        try:
            yield
        finally:
            self._send_gathered()
            self._gathered = None

    def _send_gathered(self) -> None:
        frames = self._gathered
        if frames:
            self._gathered = []
            super().write(b"".join(frames))


class ReadAheadConnection(pyamqp.Connection):  # type: ignore[misc]
    """kombu's py-amqp connection on a :class:`ReadAheadTransport` (plain TCP only).

    It does not ask for ``connection.blocked`` notifications: nothing here acts on
    them, and with them py-amqp polls the socket before every single publish. A
    broker short of memory or disk still holds the publishers back (their
    confirms wait); it just does not say so first.
    """

    negotiate_capabilities = {
        **amqp_connection.NEGOTIATE_CAPABILITIES,
        "connection.blocked": False,
    }

    def Transport(  # noqa: N802 (py-amqp's name)
        self,
        host: str,
        connect_timeout: float | None,
        ssl: Any = False,
        read_timeout: float | None = None,
        write_timeout: float | None = None,
        **kwargs: Any,
    ) -> amqp_transport._AbstractTransport:
        if ssl:
            return super().Transport(
                host, connect_timeout, ssl, read_timeout, write_timeout, **kwargs
            )
        return ReadAheadTransport(
            host,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            **kwargs,
        )


class Transport(pyamqp.Transport):  # type: ignore[misc]
    """The kombu transport of ``amqp://`` broker URLs."""

    Connection = ReadAheadConnection


def gathered_writes(connection: Connection) -> Any:
    """A block whose frames go out in one write, on a connection of this transport."""
    transport = getattr(connection.connection, "transport", None)
    if isinstance(transport, ReadAheadTransport):
        return transport.gathering()
    return nullcontext()
