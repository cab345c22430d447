"""What a process pays at start: the ``saga`` command imports no broker client library
it does not use (every process of the demo starts at once, each paying every import)."""

from __future__ import annotations

import subprocess
import sys

LOADED = (
    "import sys, saga.cli.app; "
    "print(' '.join(sorted(m for m in sys.modules if m == 'redis' or m.startswith('redis.'))))"
)


def test_the_saga_command_does_not_import_the_redis_client() -> None:
    result = subprocess.run(
        [sys.executable, "-c", LOADED], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "", result.stdout
