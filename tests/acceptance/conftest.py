"""Acceptance tests drive the ``saga`` command and the example services as subprocesses:
every one of them is ``slow`` (``make test`` runs them, ``make check`` does not)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.slow)
