"""A short chaos run as part of the suite (``make chaos`` runs a longer one)."""

from __future__ import annotations

import subprocess
import sys

from saga.examples.order_saga.chaos import KINDS
from saga.examples.order_saga.processes import REPO


def test_short_chaos_run_loses_nothing_and_applies_nothing_twice() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "saga.examples.order_saga.chaos",
         "--sagas", "120", "--duration", "30", "--interval", "1.5", "--heartbeat", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    last = result.stdout.strip().splitlines()[-1]
    figures = dict(item.split("=") for item in last.removeprefix("chaos: ").split())
    assert figures["lost"] == figures["duplicated"] == figures["unconverged"] == "0", last
    assert int(figures["sagas"]) >= 120
    for kind in KINDS:
        assert f"'{kind}'" in output, f"no {kind} fault in {output[-2000:]}"
