"""Foreign text made visible: every character shown, none acting on a terminal or a log.

Text from outside the program (message types, payloads, headers, errors, saga data,
names read from a database) reaches terminals and log files. Characters that would act
instead of being shown are written as Python escapes: control characters (ESC becomes
``\\x1b``, so no ANSI or OSC sequence gets through; a newline becomes ``\\n``, so no
value forges a line), line and paragraph separators, bidirectional overrides
(``\\u202e``) and the other invisible format characters. The CLI (``saga.cli.text``) and
the text logs (``saga.observability.logs``) both use :func:`visible`.
"""

from __future__ import annotations

import unicodedata

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


def visible(value: object, *, limit: int | None = None, multiline: bool = False) -> str:
    """``value`` as text that shows every character it holds and acts on nothing.

    None is empty. ``multiline`` keeps newlines (a traceback); otherwise they are escaped
    too, so one value stays on one line. Tabs are always escaped (a terminal or Rich
    would turn them into spaces). Past ``limit`` characters (if given) the value is cut,
    and the cut is said.
    """
    text = "" if value is None else str(value)
    cut = text if limit is None else text[:limit]
    # isprintable(): the common case, nothing to escape, without a look at each character.
    shown = cut if cut.isprintable() else "".join(_shown(char, multiline) for char in cut)
    if len(cut) < len(text):
        shown += f" … (cut: {len(text) - len(cut):,} more characters)"
    return shown
