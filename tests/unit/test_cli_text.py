"""Foreign text in the terminal (saga/cli/text.py): shown as written, acting on nothing."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from saga.cli.text import foreign, foreign_json
from saga.observability.visible_text import visible
from tests.support.hostile import acting_characters


def _printed(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


def test_markup_emoji_codes_and_escape_sequences_are_shown_as_written() -> None:
    shown = _printed(foreign("[/x] [bold]Nope[/bold] :smile: \x1b]0;title\x07 \x1b[31mred"))
    assert shown == "[/x] [bold]Nope[/bold] :smile: \\x1b]0;title\\x07 \\x1b[31mred\n"


def test_c1_controls_bidi_overrides_and_separators_are_made_visible() -> None:
    assert visible("\x9b31m \u202eevil\u202c \u2028 \u2066x\u2069") == (
        "\\x9b31m \\u202eevil\\u202c \\u2028 \\u2066x\\u2069"
    )


def test_newlines_stay_only_in_a_multiline_value() -> None:
    assert visible("one\ntwo\r\tthree") == "one\\ntwo\\r\\tthree"
    assert visible("one\ntwo\r\tthree", multiline=True) == "one\ntwo\\r\\tthree"


def test_emoji_sequences_are_drawn_as_they_are() -> None:
    family = "👨\u200d👩\u200d👧"
    scotland = "🏴" + "".join(chr(0xE0000 + ord(c)) for c in "gbsct") + "\U000e007f"
    assert visible(family) == family
    assert visible(scotland) == scotland


def test_a_long_value_is_cut_and_the_cut_is_said() -> None:
    assert visible("x" * 1_250, limit=1_000) == "x" * 1_000 + " … (cut: 250 more characters)"
    assert visible("x" * 1_000, limit=1_000) == "x" * 1_000


def test_json_strings_show_c1_controls_and_bidi_overrides_escaped() -> None:
    shown = _printed(foreign_json({"type": "\x9b2J\u202e[/x]", "n": 1}))
    assert '"type": "\\x9b2J\\u202e[/x]"' in shown
    assert "\x9b" not in shown and "\u202e" not in shown


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=300), st.booleans())
def test_nothing_shown_acts_on_the_terminal(value: str, multiline: bool) -> None:
    assert not acting_characters(_printed(foreign(value, multiline=multiline)))
