"""Log context: ``saga_id``, ``message_id``, ``step`` and ``consumer`` on every line.

The consumer runtime binds these around each delivery; a filter installed by
:func:`saga.logs.configure_logging` copies them onto every record logged
meanwhile, by our code or by the user's handler.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

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
