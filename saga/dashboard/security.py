"""Who may change anything from the dashboard.

Without ``SAGA_DASHBOARD_TOKEN`` the dashboard is read-only. With it, an operator signs
in with the token and a name and gets a server-side session (:mod:`.sessions`): the
browser's cookie (Starlette's ``SessionMiddleware``, signed by itsdangerous with a key
derived from the token, ``HttpOnly`` and ``SameSite=Strict``) only names it. Signing
out, an idle timeout, a maximum lifetime, a new token or a restart end it. Every action
form carries the session's own CSRF token.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import MutableMapping
from typing import Any

from saga.dashboard.sessions import SessionStore, SignedIn
from saga.errors import ActionRefused

ENV_TOKEN = "SAGA_DASHBOARD_TOKEN"
SESSION_COOKIE = "saga_dashboard_session"
#: The key of the session id in the signed cookie's data.
SESSION_ID = "session"
_OPERATOR_NAME = re.compile(r"^[\w .@-]{1,64}$")


def _same(given: str, expected: str) -> bool:
    """Constant-time equality of two texts, whatever characters they hold."""
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


class Guard:
    """Signs operators in and out, and checks sessions and CSRF tokens against the
    dashboard's token (None: read-only)."""

    def __init__(self, token: str | None, sessions: SessionStore | None = None) -> None:
        self._token = token or None
        self.sessions = sessions or SessionStore()
        self._read_only_key = secrets.token_hex(32)

    @property
    def read_only(self) -> bool:
        return self._token is None

    @property
    def cookie_key(self) -> str:
        """The key that signs the session cookie: derived from the dashboard's token, so a
        cookie signed under another token is void; random on a read-only dashboard (whose
        cookie only carries the pages' messages)."""
        if self._token is None:
            return self._read_only_key
        return hmac.new(self._token.encode(), b"saga-dashboard-cookie", hashlib.sha256).hexdigest()

    def sign_in(self, session: MutableMapping[str, Any], token: str, operator: str) -> str:
        """Open a session for ``operator`` if ``token`` is the dashboard's; returns the
        name. Any session the cookie named before ends (a fresh id on every sign-in)."""
        if self._token is None:
            raise ActionRefused("this dashboard is read-only: it was started without a token")
        if not _same(token, self._token):
            raise ActionRefused("wrong token")
        operator = operator.strip()
        if not _OPERATOR_NAME.match(operator):
            raise ActionRefused("give your name (letters, digits, space, . @ - _; 64 at most)")
        self.sign_out(session)
        session[SESSION_ID] = self.sessions.open(operator)
        return operator

    def sign_out(self, session: MutableMapping[str, Any]) -> None:
        """End the session the cookie names, here on the server: its cookie is void."""
        self.sessions.close(session.pop(SESSION_ID, None))

    def signed_in(self, session: MutableMapping[str, Any]) -> SignedIn | None:
        """The open session the cookie names, if any."""
        if self._token is None:
            return None
        return self.sessions.find(session.get(SESSION_ID))

    def authorize(self, session: MutableMapping[str, Any], csrf: str | None) -> str:
        """The operator allowed to act, or :class:`ActionRefused` saying why not."""
        if self._token is None:
            raise ActionRefused(
                f"this dashboard is read-only: start it with {ENV_TOKEN} set to allow actions"
            )
        signed_in = self.signed_in(session)
        if signed_in is None:
            raise ActionRefused("sign in with the dashboard's token first")
        if not csrf or not _same(csrf, signed_in.csrf):
            raise ActionRefused("the form's CSRF token is missing or wrong; reload the page")
        return signed_in.operator
