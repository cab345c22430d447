"""Foreign text in the terminal: shown as data, never read as markup, escapes or control.

Everything the CLI prints that it did not write itself (message types, payloads, headers,
errors and tracebacks, saga data, names read from a database, exception messages) goes
through :func:`foreign` (or :func:`foreign_json`), which returns a Rich ``Text``: Rich
never parses it for ``[markup]`` or ``:emoji:`` codes. Characters that would act on the
terminal are written as escapes (ESC as ``\\x1b``, a bidi override as ``\\u202e``: see
:func:`saga.observability.visible_text.visible`). Very long values are cut, and the cut
says how much was left out.
"""

from __future__ import annotations

import json
from typing import Any

from rich.highlighter import JSONHighlighter
from rich.text import Text

from saga.observability.visible_text import visible

#: A value in a table cell or on one line: at most this many characters are shown.
CELL_LIMIT = 1_000
#: A value shown on its own (a traceback, a payload): at most this many characters.
BLOCK_LIMIT = 20_000


def foreign(
    value: object, *, style: str = "", limit: int = CELL_LIMIT, multiline: bool = False
) -> Text:
    """``value`` as a Rich ``Text`` for a table cell or a line (``multiline``: a block such
    as a traceback), at most ``limit`` characters of it."""
    return Text(visible(value, limit=limit, multiline=multiline), style=style)


def foreign_json(data: Any, *, limit: int = BLOCK_LIMIT) -> Text:
    """``data`` as indented, highlighted JSON whose strings act on nothing (JSON escapes
    C0 controls; the others, bidi overrides and C1 controls among them, are made visible)."""
    document = json.dumps(data, indent=2, ensure_ascii=False, default=str)
    text = Text(visible(document, limit=limit, multiline=True))
    JSONHighlighter().highlight(text)
    return text
