"""The ``schema=`` a harness is given: SQL files (``Path`` or ``str``) or SQL texts."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from saga.errors import HarnessSetupError


def schema_texts(entries: Iterable[str | Path]) -> list[str]:
    """The SQL of each entry: a ``Path``, or a ``str`` naming an existing file, is read;
    any other ``str`` is SQL, unless it is a single word, which is neither."""
    return [_text(entry) for entry in entries]


def _text(entry: str | Path) -> str:
    if isinstance(entry, Path):
        if not entry.is_file():
            raise HarnessSetupError(f"schema file {str(entry)!r} does not exist")
        return entry.read_text()
    if _names_a_file(entry):
        return Path(entry).read_text()
    if len(entry.split()) < 2:
        raise HarnessSetupError(
            f"schema entry {entry!r} is neither an existing file nor SQL: give the path of an "
            f"existing file (relative to {str(Path.cwd())!r}) or the SQL text itself"
        )
    return entry


def _names_a_file(entry: str) -> bool:
    if "\n" in entry:
        return False  # SQL text: no file has a line break in its name
    try:
        return Path(entry).is_file()
    except (OSError, ValueError):  # longer than a file name can be, or a NUL in it
        return False
