"""Logging set-up for the ``saga`` command: text or JSON lines, passwords scrubbed."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from saga.logcontext import ContextFilter
from saga.redact import redact_text

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
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = [f"{k}={getattr(record, k)}" for k in CONTEXT_KEYS if getattr(record, k, None)]
        return f"{line} [{' '.join(context)}]" if context else line


class JsonFormatter(logging.Formatter):
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
