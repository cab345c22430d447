"""``saga demo`` (what ``make demo`` runs) on the embedded PostgreSQL, as a user would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from saga.examples.order_saga.processes import REPO, SAGA


def test_demo_runs_end_to_end_without_servers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env["SAGA_DEMO_DIR"] = str(tmp_path / "demo")
    result = subprocess.run(
        [SAGA, "demo", "--orders", "60"],
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
    assert "completed" in out and "compensated" in out
    assert "business invariants hold" in out
    assert "notices_duplicated=0" in out and "notices_missing=0" in out
    assert "OrderApproved" in out and "approved in total" in out  # the subscribers' table
    assert "timeline" in out
