"""Running the ``saga`` command as a user would, against one database."""

from __future__ import annotations

import subprocess

from saga.examples.order_saga.processes import REPO, SAGA


def saga_cli(database_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``saga *args`` with ``SAGA_DATABASE_URL`` (plus ``env``), wide output, captured."""
    return subprocess.run(
        [SAGA, *args],
        cwd=REPO,
        env={"SAGA_DATABASE_URL": database_url, "COLUMNS": "200", "PATH": "", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
