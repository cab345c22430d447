"""The examples of docs/testing.md are tests of this project, word for word."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = [
    ROOT / "tests" / "examples" / "test_order_saga_harness.py",
    ROOT / "tests" / "examples" / "test_order_saga_scenarios.py",
    ROOT / "tests" / "integration" / "test_saga_testing.py",
]


def test_every_python_example_in_the_testing_guide_is_a_test() -> None:
    guide = (ROOT / "docs" / "testing.md").read_text()
    sources = [textwrap.dedent(path.read_text()) for path in TESTS]
    examples = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    assert len(examples) >= 5
    missing = [
        example
        for example in examples
        if not any(_normal(example) in _normal(source) for source in sources)
    ]
    assert missing == []


def _normal(code: str) -> str:
    """Lines stripped of their indentation, so a fragment matches inside a function."""
    return "\n".join(line.strip() for line in code.strip().splitlines())
