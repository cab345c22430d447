"""What saga data must be to be stored: small enough, and free of NUL characters.

Saga data lives in a jsonb column. PostgreSQL's jsonb refuses the NUL character
(``\\u0000``) in any string, so such data is refused here, before anything is
written, with the place it was found, instead of failing inside the
transaction that writes it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from saga.errors import SagaDataRefused, SagaDataTooLarge

#: ``\\u0000`` in JSON text, not preceded by an escaping backslash.
_ESCAPED_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def check_storable(saga: str, data: BaseModel, max_bytes: int) -> None:
    """Raise :class:`SagaDataTooLarge` or :class:`SagaDataRefused` unless ``data`` can be
    stored as saga ``saga``'s data."""
    text = data.__pydantic_serializer__.to_json(data)
    if len(text) > max_bytes:
        raise SagaDataTooLarge(saga, len(text), max_bytes)
    if b"\\u0000" in text and _ESCAPED_NUL.search(text):  # the plain test first: it is cheap
        where = ", ".join(_nul_paths(data.model_dump(mode="json"), "data"))
        raise SagaDataRefused(
            f"saga {saga!r} data holds a NUL character (\\u0000) at {where}: PostgreSQL's "
            "jsonb cannot store it; remove it (or encode the value) before it reaches the data"
        )


def _nul_paths(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, str):
        if "\x00" in value:
            yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            if "\x00" in key:
                yield f"{path} (a key)"
            yield from _nul_paths(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _nul_paths(item, f"{path}[{index}]")
