"""The dashboard's signed-in sessions, held in the dashboard process (server side).

The browser's cookie only names a session (a random id, signed); the session itself
lives here, so signing out ends it for good: the old cookie then names nothing. A
session also ends after :data:`IDLE_TIMEOUT_S` without a request and
:data:`LIFETIME_S` after sign-in, and every session ends when the dashboard restarts.
Each session has its own CSRF token, so a form token taken from one session is worth
nothing in another.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: A session unused this long is over: the operator signs in again.
IDLE_TIMEOUT_S = 30 * 60
#: A session is over this long after sign-in, however busy.
LIFETIME_S = 12 * 60 * 60


@dataclass(slots=True)
class SignedIn:
    """One operator's session: who, the CSRF token its forms carry, and when."""

    operator: str
    csrf: str
    signed_in_at: float
    last_seen: float


class SessionStore:
    """Open sessions by id. ``clock`` (seconds, monotonic) is replaceable in tests."""

    def __init__(
        self,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        lifetime_s: float = LIFETIME_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.lifetime_s = lifetime_s
        self._clock = clock
        self._sessions: dict[str, SignedIn] = {}
        self._lock = threading.Lock()

    def open(self, operator: str) -> str:
        """A new session for ``operator``; returns its id."""
        now = self._clock()
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            self._drop_expired(now)
            self._sessions[session_id] = SignedIn(operator, secrets.token_urlsafe(32), now, now)
        return session_id

    def find(self, session_id: object) -> SignedIn | None:
        """The open session ``session_id`` names (its idle time starts again), or None."""
        if not isinstance(session_id, str):
            return None
        now = self._clock()
        with self._lock:
            found = self._sessions.get(session_id)
            if found is None:
                return None
            if self._expired(found, now):
                del self._sessions[session_id]
                return None
            found.last_seen = now
            return found

    def close(self, session_id: object) -> None:
        """End a session (sign-out); its id names nothing from now on."""
        if isinstance(session_id, str):
            with self._lock:
                self._sessions.pop(session_id, None)

    def _expired(self, session: SignedIn, now: float) -> bool:
        return (
            now - session.last_seen > self.idle_timeout_s
            or now - session.signed_in_at > self.lifetime_s
        )

    def _drop_expired(self, now: float) -> None:
        for session_id in [k for k, s in self._sessions.items() if self._expired(s, now)]:
            del self._sessions[session_id]
