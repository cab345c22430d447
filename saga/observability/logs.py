"""Logging: text or JSON lines, passwords scrubbed, and the per-delivery log context.

The consumer runtime binds ``saga_id``, ``message_id``, ``step`` and ``consumer``
around each delivery (:func:`log_context`); the filter installed by
:func:`configure_logging` copies them onto every record logged meanwhile, by our
code or by the user's handler.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from saga.observability.redaction import redact_text
from saga.observability.visible_text import visible

_fields: ContextVar[dict[str, str]] = ContextVar("saga_log_context", default={})  # noqa: B039


@contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Add ``fields`` (None values are left out) to every log record in this block."""
    token = _fields.set(
        {**_fields.get(), **{k: str(v) for k, v in fields.items() if v is not None}}
    )
    try:
        yield
    finally:
        _fields.reset(token)


def current() -> dict[str, str]:
    return dict(_fields.get())


class ContextFilter(logging.Filter):
    """Copies the bound fields onto each record (explicit ``extra=`` values win)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _fields.get().items():
            if not getattr(record, key, None):
                setattr(record, key, value)
        return True


#: ``extra=`` keys that are copied into every formatted line that carries them.
CONTEXT_KEYS = ("saga_id", "message_id", "step", "consumer", "destination")


class RedactingFilter(logging.Filter):
    """Masks URL passwords and the given secrets in every record's message."""

    def __init__(self, *secrets: str | None) -> None:
        super().__init__()
        self.secrets = tuple(s for s in secrets if s)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message, *self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text = redact_text(str(exc), *self.secrets)
            if text != str(exc):
                record.exc_text = f"{type(exc).__name__}: {text}"
                record.exc_info = None
        return True


class TextFormatter(logging.Formatter):
    """A record is one line that starts at column 0; its exception, if any, follows on
    lines indented by two spaces. The message and context values are foreign text (a
    message type, an error): control characters in them are escaped (``\\n``,
    ``\\x1b``), so no value can forge a log line or act on the terminal that shows it."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = visible(record.getMessage())
        record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        context = [
            f"{k}={visible(getattr(record, k))}" for k in CONTEXT_KEYS if getattr(record, k, None)
        ]
        if context:
            line = f"{line} [{' '.join(context)}]"
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        details = [text for text in (record.exc_text, record.stack_info) if text]
        for text in details:
            line += "".join(f"\n  {part}" for part in visible(text, multiline=True).split("\n"))
        return line


class JsonFormatter(logging.Formatter):
    """A record is one JSON object on one line: foreign text travels as JSON strings
    (escaped by ``json.dumps``, non-ASCII characters among them)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in CONTEXT_KEYS:
            value = getattr(record, key, None)
            if value:
                entry[key] = str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry)


def configure_logging(level: str = "INFO", fmt: str = "text", *secrets: str | None) -> None:
    """Send logs to stderr in ``fmt`` ('text' or 'json'), scrubbing ``secrets``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    handler.addFilter(RedactingFilter(*secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
