"""Messages from the server to the next page (flash messages), carried in the signed
session cookie and shown once. Never in a query string: a crafted link cannot put words
in the dashboard's mouth."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Literal

Kind = Literal["notice", "problem"]
_KEY = "flash"
#: A message is cut to this length (the cookie holds 4 kB; the actions log keeps all).
MAX_CHARS = 400


def flash(session: MutableMapping[str, Any], kind: Kind, text: str) -> None:
    """Keep ``text`` for the next page the browser shows."""
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS] + " … (cut: the actions log has it all)"
    session[_KEY] = [*session.get(_KEY, []), [kind, text]]


def take(session: MutableMapping[str, Any]) -> list[tuple[str, str]]:
    """The messages waiting for this page; each is shown once."""
    waiting = session.pop(_KEY, None)
    if not isinstance(waiting, list):
        return []
    return [(str(kind), str(text)) for kind, text in waiting]
