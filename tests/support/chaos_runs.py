"""Running ``make chaos`` as a subprocess and reading its machine-readable last line."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from saga.examples.order_saga.processes import REPO


@dataclass(frozen=True)
class ChaosRun:
    output: str
    #: The last line's figures: sagas, faults, lost, duplicated, unconverged, converge_s.
    figures: dict[str, str]
    last_line: str


def clean_chaos_run(*args: str, timeout: float = 900) -> ChaosRun:
    """``python -m tests.rig.chaos *args``: it must exit 0 with nothing lost,
    duplicated or unconverged."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.rig.chaos", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    last = result.stdout.strip().splitlines()[-1]
    figures = dict(item.split("=") for item in last.removeprefix("chaos: ").split())
    assert figures["lost"] == figures["duplicated"] == figures["unconverged"] == "0", last
    return ChaosRun(output, figures, last)
