"""Foreign text in the terminal: shown as data, never read as markup, escapes or control.

Everything the CLI prints that it did not write itself (message types, payloads, headers,
errors and tracebacks, saga data, names read from a database, exception messages) goes
through :func:`foreign` (or :func:`foreign_json`), which returns a Rich ``Text``: Rich
never parses it for ``[markup]`` or ``:emoji:`` codes. Characters that would act on the
terminal instead of being shown are written as Python escapes: control characters (ESC
becomes ``\\x1b``, so no ANSI or OSC sequence reaches the terminal), line and paragraph
separators, bidirectional overrides (``\\u202e``) and the other invisible format
characters. Very long values are cut, and the cut says how much was left out.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

from rich.highlighter import JSONHighlighter
from rich.text import Text

#: A value in a table cell or on one line: at most this many characters are shown.
CELL_LIMIT = 1_000
#: A value shown on its own (a traceback, a payload): at most this many characters.
BLOCK_LIMIT = 20_000

#: Format characters that are part of how visible text is drawn, shown as they are: the
#: zero-width joiner (emoji sequences) and the tag characters of flag emoji.
_DRAWN = {0x200D, *range(0xE0020, 0xE0080)}
#: Categories made visible: controls, surrogates, line and paragraph separators, format.
_ESCAPED_CATEGORIES = {"Cc", "Cs", "Zl", "Zp", "Cf"}


#: The usual short escapes; every other character is written by its code point.
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _shown(char: str, multiline: bool) -> str:
    if multiline and char == "\n":
        return char
    if unicodedata.category(char) in _ESCAPED_CATEGORIES and ord(char) not in _DRAWN:
        return _escape(char)
    return char


def visible(value: object, *, limit: int = CELL_LIMIT, multiline: bool = False) -> str:
    """``value`` as text that shows every character it holds and acts on nothing.

    None is empty. ``multiline`` keeps newlines (a traceback); otherwise they are escaped
    too, so one value stays on one line. Tabs are always escaped (Rich would turn them
    into spaces). Past ``limit`` characters the value is
    cut, and the cut is said.
    """
    text = "" if value is None else str(value)
    cut = text[:limit]
    shown = "".join(_shown(char, multiline) for char in cut)
    if len(text) > limit:
        shown += f" … (cut: {len(text) - limit:,} more characters)"
    return shown


def foreign(
    value: object, *, style: str = "", limit: int = CELL_LIMIT, multiline: bool = False
) -> Text:
    """``value`` as a Rich ``Text`` for a table cell or a line: see :func:`visible`."""
    return Text(visible(value, limit=limit, multiline=multiline), style=style)


def foreign_json(data: Any, *, limit: int = BLOCK_LIMIT) -> Text:
    """``data`` as indented, highlighted JSON whose strings act on nothing (JSON escapes
    C0 controls; the others, bidi overrides and C1 controls among them, are made visible)."""
    document = json.dumps(data, indent=2, ensure_ascii=False, default=str)
    text = Text(visible(document, limit=limit, multiline=True))
    JSONHighlighter().highlight(text)
    return text
