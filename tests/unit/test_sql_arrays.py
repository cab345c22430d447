"""Lists go to PostgreSQL in binary: an array parameter in text format costs far more.

psycopg dumps a text-format array element by element in Python, escaping each one (a
bytea element becomes hex): 100 message bodies of 450 bytes took 1.9 ms to send that
way and 0.2 ms in binary (``%b``). Every statement that takes a list is on a hot path
(the outbox, the inbox, the relay, the PostgreSQL broker), so none may take it as ``%s``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: A placeholder cast to an array, or compared with ANY(...), in text format.
TEXT_ARRAY = re.compile(r"%s::\w+\[\]|ANY\(%s\)")


def test_no_statement_takes_a_list_in_text_format() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for top in ("saga", "consumers", "outbox_relay")
        for path in sorted((ROOT / top).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if TEXT_ARRAY.search(line)
    ]
    assert found == []
