"""Keeping secrets out of output: passwords in URLs and logs, sensitive payload fields."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URL_IN_TEXT = re.compile(r"([a-z][a-z0-9+.-]*://)([^/\s:@]*):([^@\s]*)@", re.IGNORECASE)


def redact_url(url: str | None) -> str:
    """Return ``url`` with any password replaced by ``***`` (URL or key=value DSN; a list of
    URLs separated by ``;``, a broker's failover nodes, URL by URL)."""
    if not url:
        return ""
    if _is_url_list(url):
        return ";".join(redact_url(one) for one in url.split(";"))
    if "://" not in url:
        return _KEYWORD_PASSWORD.sub(r"\1***", url)
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    if parts.password is None:
        return _KEYWORD_PASSWORD.sub(r"\1***", url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:***@{host}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    query = _KEYWORD_PASSWORD.sub(r"\1***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _is_url_list(text: str) -> bool:
    """True for URLs separated by ``;`` (a ``;`` inside one URL, a password's, is not)."""
    parts = text.split(";")
    return len(parts) > 1 and all("://" in part for part in parts if part)


def redact_text(text: str, *secrets: str | None) -> str:
    """Mask URL passwords, ``password=`` pairs and any of ``secrets`` found in ``text``."""
    text = _URL_IN_TEXT.sub(r"\1\2:***@", text)
    text = _KEYWORD_PASSWORD.sub(r"\1***", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def passwords_of(url: str | None) -> list[str]:
    """Every password inside ``url`` (each node's of a ``;``-separated failover list)."""
    if not url:
        return []
    found = (password_of(one) for one in (url.split(";") if _is_url_list(url) else [url]))
    return [password for password in found if password]


def password_of(url: str | None) -> str | None:
    """The password inside ``url``, if any (to scrub it from third-party text)."""
    if not url:
        return None
    if "://" in url:
        try:
            return urlsplit(url).password
        except ValueError:
            return None
    match = _KEYWORD_PASSWORD.search(url)
    return match.group(2).strip("'") if match else None


MASK = "***"

_SENSITIVE = re.compile(
    r"(pass(word|wd|phrase)?|secret|token|api[_-]?key|private[_-]?key|credential|auth"
    r"|card([_-]?(number|no|num))?|pan|cvv|cvc|iban|account[_-]?(number|no)|routing[_-]?number"
    r"|ssn|social[_-]?security|tax[_-]?id|national[_-]?id|passport|licen[cs]e[_-]?number"
    r"|e[_-]?mail|phone|mobile|address|street|postcode|zip([_-]?code)?|birth|dob"
    r"|first[_-]?name|last[_-]?name|full[_-]?name|surname)",
    re.IGNORECASE,
)


def is_sensitive(field: str) -> bool:
    """True when a field name suggests a secret or personal data."""
    return bool(_SENSITIVE.search(field))


def mask(value: Any) -> Any:
    """A copy of ``value`` with every sensitive field's value replaced by ``***``."""
    if isinstance(value, dict):
        return {k: MASK if is_sensitive(str(k)) else mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value
