"""A fake card payment gateway with a real HTTP contract, for the example and its tests.

Like real gateways, it takes an idempotency key with every request and answers a
repeated key with the original outcome. It also counts the calls per key, so a
test can tell whether a charge was attempted twice.

Outages on demand (``POST /admin``, or :meth:`GatewayClient.set_faults`): while
``charges_down``, every charge is answered 503; the next ``drop_charges`` new
charges are made and then the connection is dropped before the answer (the
payments service cannot know the card was charged).

    python -m saga.examples.order_saga.gateway --port 8765
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import threading
import urllib.error
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

DECLINED = "tok_declined"


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.charges: dict[str, dict[str, Any]] = {}
        self.refunds: dict[str, dict[str, Any]] = {}
        self.charges_down = False
        self.drop_charges = 0


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a client's connection serves many calls
        # An answer's headers and body are two writes: with Nagle's algorithm on, the body
        # would wait for the client's delayed ACK of the headers (40 ms) on every call.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            kind, _, key = self.path.strip("/").partition("/")
            with state.lock:
                if kind == "calls":
                    return self._reply(200, dict(state.calls))
                if kind == "state":
                    return self._reply(200, {"charges": state.charges, "refunds": state.refunds})
                found = {"charges": state.charges, "refunds": state.refunds}.get(kind, {}).get(key)
            self._reply(200 if found else 404, found or {"error": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/admin":
                with state.lock:
                    state.charges_down = bool(body.get("charges_down", state.charges_down))
                    state.drop_charges = int(body.get("drop_charges", state.drop_charges))
                return self._reply(200, {"ok": True})
            key = body["idempotency_key"]
            with state.lock:
                state.calls[key] += 1
                if self.path == "/charges":
                    if state.drop_charges and key not in state.charges:
                        state.drop_charges -= 1
                        state.charges[key] = _charge(key, body, len(state.charges))
                        self.close_connection = True  # charged; the answer is lost
                        return None
                    if state.charges_down:
                        return self._reply(503, {"error": "charges are down"})
                    outcome = state.charges.setdefault(key, _charge(key, body, len(state.charges)))
                else:
                    outcome = state.refunds.setdefault(
                        key, {"id": f"re_{len(state.refunds)}", "charge": body["charge"]}
                    )
            self._reply(200, outcome)

    return Handler


def _charge(key: str, body: dict[str, Any], n: int) -> dict[str, Any]:
    status = "declined" if body["card_token"] == DECLINED else "succeeded"
    return {"id": f"ch_{n}", "key": key, "amount_cents": body["amount_cents"], "status": status}


class GatewayServer:
    """The fake gateway on a local port, in a thread of this process."""

    def __init__(self, port: int = 0) -> None:
        self.state = _State()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self.state))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> GatewayServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self.server.shutdown()
        self.server.server_close()


class GatewayClient:
    """What the payments service uses to talk to the gateway.

    Each thread keeps one HTTP/1.1 connection open across calls, as a real client
    (a ``requests.Session``) would. A call whose connection fails closes it and
    raises, without trying again: a charge's answer that was lost stays lost, and
    the guarded side effect decides what happens next.
    """

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._address = urlsplit(self.url)
        self._local = threading.local()

    def charge(self, key: str, amount_cents: int, card_token: str) -> dict[str, Any]:
        body = {"idempotency_key": key, "amount_cents": amount_cents, "card_token": card_token}
        return self._post("/charges", body)

    def find_charge(self, key: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self._get(f"/charges/{key}")
        return found

    def refund(self, key: str, charge: str) -> dict[str, Any]:
        return self._post("/refunds", {"idempotency_key": key, "charge": charge})

    def find_refund(self, key: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self._get(f"/refunds/{key}")
        return found

    def calls(self) -> dict[str, int]:
        return self._get("/calls") or {}

    def state(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Every charge and refund the gateway holds, by idempotency key."""
        found: dict[str, dict[str, dict[str, Any]]] = self._get("/state")
        return found

    def set_faults(self, *, charges_down: bool, drop_charges: int = 0) -> None:
        """Start or end a charge outage; make the next ``drop_charges`` charges lose their
        answers."""
        self._post("/admin", {"charges_down": charges_down, "drop_charges": drop_charges})

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        status, data = self._request("POST", path, json.dumps(body).encode())
        if status >= 400:
            raise self._failed(path, status, data)
        result: dict[str, Any] = json.loads(data)
        return result

    def _get(self, path: str) -> Any:
        status, data = self._request("GET", path)
        if status == 404:
            return None
        if status >= 400:
            raise self._failed(path, status, data)
        return json.loads(data)

    def _failed(self, path: str, status: int, data: bytes) -> urllib.error.HTTPError:
        """The error urllib would raise for an answer with this status."""
        headers = http.client.HTTPMessage()
        return urllib.error.HTTPError(self.url + path, status, data.decode(), headers, None)

    def _request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(
                self._address.hostname or "127.0.0.1", self._address.port, timeout=self.timeout
            )
            self._local.conn = conn
        try:
            conn.request(method, path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        except Exception:
            conn.close()
            self._local.conn = None
            raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    server = GatewayServer(args.port).start()
    print(f"payment gateway on {server.url}", flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
