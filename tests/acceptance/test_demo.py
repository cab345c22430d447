"""``saga demo`` (what ``make demo`` runs) on the embedded PostgreSQL, as a user would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from saga.examples.order_saga.processes import REPO, SAGA
from tests.support.demo_output import assert_settled, read_demo

#: What the README promises: ``saga demo`` submits 200 orders as a stream of 50 a second.
DEFAULT_ORDERS = 200
DEFAULT_RATE = 50


def test_demo_runs_end_to_end_without_servers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env["SAGA_DEMO_DIR"] = str(tmp_path / "demo")
    result = subprocess.run(
        [SAGA, "demo"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "embedded PostgreSQL" in out
    run = read_demo(out)
    assert_settled(run, DEFAULT_ORDERS)
    # A steady stream: the last order goes (orders - 1) / rate seconds after the first.
    assert run.submitting_s >= (DEFAULT_ORDERS - 1) // DEFAULT_RATE, run
    assert "OrderApproved" in out and "approved in total" in out  # the subscribers' table
