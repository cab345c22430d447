"""Hostile text for property tests: what anyone who can publish to a queue, or any error
message, may bring in front of an operator.

Rich markup, ANSI and OSC escape sequences (colours, the terminal's title, its
clipboard, erasing a line), C0 and C1 controls, bidirectional overrides, line
separators, emoji codes, combining marks and wide characters, and values long enough
to be cut. PostgreSQL text cannot hold NUL, so no string here does.
"""

from __future__ import annotations

import unicodedata

from hypothesis import strategies as st

NASTIES = (
    "[/x] [bold]Nope[/bold]",
    "[link=https://evil.example]click[/link]",
    "[red]",
    "\x1b]0;pwned\x07",
    "\x1b]52;c;cGF5bG9hZA==\x07",
    "\x1b[31mred\x1b[0m",
    "\r\x1b[2K",
    "\x9b2J",
    "\x85",
    "\u202eevil\u202c",
    "\u2066rtl\u2069",
    "\u2028",
    "\ufeff",
    ":smile:",
    "line one\nforged line",
    "e\u0301\u0301\u0301",
    "東京",
    "\\x1b",
    '"quoted" \\ back',
)

#: Any character PostgreSQL text holds (no NUL, no lone surrogate).
_ANY_CHAR = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
_PIECE = st.one_of(st.sampled_from(NASTIES), st.text(_ANY_CHAR, max_size=20))
_SHORT = st.lists(_PIECE, min_size=1, max_size=4).map("".join)
_LONG = st.builds(lambda edge, n: edge + "x" * n + edge, _SHORT, st.integers(1_000, 3_000))


def hostile_text() -> st.SearchStrategy[str]:
    """A short hostile string, or now and then one too long to show whole."""
    return st.one_of(_SHORT, _SHORT, _LONG)


#: Bidirectional controls: they reorder what the terminal shows after them.
BIDI_CONTROLS = frozenset(
    [
        "\u061c",
        "\u200e",
        "\u200f",
        *map(chr, range(0x202A, 0x202F)),
        *map(chr, range(0x2066, 0x206A)),
    ]
)


def acting_characters(output: str, *, keep: str = "\n") -> list[str]:
    """The characters of ``output`` (but ``keep``) that would act on a terminal instead of
    being shown: controls (ESC among them), separators, bidi controls."""
    return [
        char
        for char in output
        if char not in keep
        and (unicodedata.category(char) in {"Cc", "Cs", "Zl", "Zp"} or char in BIDI_CONTROLS)
    ]
