"""Running the chaos tool (``saga.examples.order_saga.chaos``) from a test."""

from __future__ import annotations

import subprocess
import sys

from saga.examples.order_saga.processes import REPO


def run_chaos(*args: str, timeout: float = 900) -> tuple[str, dict[str, str]]:
    """Run the chaos tool with ``args``, which must exit 0; its output, and the figures of
    its last line (``chaos: sagas=N faults=N lost=N ...``)."""
    result = subprocess.run(
        [sys.executable, "-m", "saga.examples.order_saga.chaos", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    last = result.stdout.strip().splitlines()[-1]
    return output, dict(item.split("=") for item in last.removeprefix("chaos: ").split())
