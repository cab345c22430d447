"""Who may change anything from the dashboard.

Without ``SAGA_DASHBOARD_TOKEN`` the dashboard is read-only. With it, an operator signs
in with the token and a name; the session cookie carries the name and a signature
(HMAC with the token), so changing the name voids it. Every action form carries a
CSRF token derived from the session (the double-submit of a value another site can
neither read nor forge); the cookie is ``SameSite=Strict`` and ``HttpOnly`` as well.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from saga.errors import ActionRefused

ENV_TOKEN = "SAGA_DASHBOARD_TOKEN"
SESSION_COOKIE = "saga_dashboard_session"
_OPERATOR_NAME = re.compile(r"^[\w .@-]{1,64}$")


class Guard:
    """Checks sessions and CSRF tokens against the dashboard's token (None: read-only)."""

    def __init__(self, token: str | None) -> None:
        self._key = token.encode() if token else None

    @property
    def read_only(self) -> bool:
        return self._key is None

    def _sign(self, purpose: str, operator: str) -> str:
        assert self._key is not None
        return hmac.new(self._key, f"{purpose}:{operator}".encode(), hashlib.sha256).hexdigest()

    def sign_in(self, token: str, operator: str) -> str:
        """The session cookie's value for ``operator``, if ``token`` is the dashboard's."""
        if self._key is None:
            raise ActionRefused("this dashboard is read-only: it was started without a token")
        if not hmac.compare_digest(token.encode(), self._key):
            raise ActionRefused("wrong token")
        operator = operator.strip()
        if not _OPERATOR_NAME.match(operator):
            raise ActionRefused("give your name (letters, digits, space, . @ - _; 64 at most)")
        return f"{operator}|{self._sign('session', operator)}"

    def operator(self, cookie: str | None) -> str | None:
        """The operator a session cookie names, if its signature holds."""
        if self._key is None or not cookie or "|" not in cookie:
            return None
        operator, signature = cookie.rsplit("|", 1)
        expected = self._sign("session", operator)
        return operator if hmac.compare_digest(signature, expected) else None

    def csrf_token(self, operator: str) -> str:
        return self._sign("csrf", operator)

    def authorize(self, cookie: str | None, csrf: str | None) -> str:
        """The operator allowed to act, or :class:`ActionRefused` saying why not."""
        if self._key is None:
            raise ActionRefused(
                f"this dashboard is read-only: start it with {ENV_TOKEN} set to allow actions"
            )
        operator = self.operator(cookie)
        if operator is None:
            raise ActionRefused("sign in with the dashboard's token first")
        if not csrf or not hmac.compare_digest(csrf, self.csrf_token(operator)):
            raise ActionRefused("the form's CSRF token is missing or wrong; reload the page")
        return operator
