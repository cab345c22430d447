"""A TCP proxy in front of a server, for tests that lose a connection at a chosen moment.

Every connection made to :attr:`TcpProxy.url` is forwarded to the server. The proxy can
hold back what the server sends (:meth:`hold_replies`: the client's frames still reach
the server, its answers wait in the proxy) and cut every open connection (:meth:`cut`),
so a test can lose a connection after the server took a request and before the client
heard the answer. Both directions are real sockets; nothing is faked.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to the server of ``url``; see the module docstring."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5672)
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        credentials = parts.netloc.rpartition("@")[0]
        netloc = f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"
        self.url = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
        self._replies = threading.Event()
        self._replies.set()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    def hold_replies(self) -> None:
        """From now on, keep what the server sends in the proxy instead of passing it on."""
        self._replies.clear()

    def release(self) -> None:
        """Pass the server's answers on again (new connections included)."""
        self._replies.set()

    def cut(self) -> None:
        """Close every open connection, both sides; what was held back is never delivered."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self._listener.close()
        self.cut()
        self.release()  # lets the forwarding threads see their sockets closed and end

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self._target)
            with self._lock:
                self._sockets += [client, server]
            for source, sink, gate in ((client, server, None), (server, client, self._replies)):
                threading.Thread(
                    target=self._forward, args=(source, sink, gate), daemon=True
                ).start()

    def _forward(
        self, source: socket.socket, sink: socket.socket, gate: threading.Event | None
    ) -> None:
        try:
            while data := source.recv(65536):
                if gate is not None:
                    gate.wait()
                sink.sendall(data)
        except OSError:
            pass  # cut, or the other side went away
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
