"""Foreign text in the logs: one record stays one line, and says what it was given.

JSON lines carry it as JSON strings; text lines escape its control characters, so a
message type or an error cannot forge a log line or act on the terminal showing it.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from saga.observability.logs import configure_logging
from saga.observability.visible_text import visible
from tests.support.hostile import acting_characters, hostile_text

logger = logging.getLogger("saga.tests.hostile")
# The fixtures hold for every example: the root logger is restored once, after them all.
LOG_EXAMPLES = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture
def root_logger() -> Iterator[None]:
    """configure_logging replaces the root logger's handlers: put them back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _log_two_records(fmt: str, text: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A warning and an exception, both carrying ``text``, as ``fmt`` lines."""
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    configure_logging("INFO", fmt)
    logger.warning("rejected: %s", text, extra={"consumer": text})
    try:
        raise ValueError(text)
    except ValueError:
        logger.exception("handler failed on %s", text)
    return out.getvalue()


@given(text=hostile_text().filter(bool))  # an empty context value is left out
@LOG_EXAMPLES
def test_json_lines_carry_foreign_text_as_json_strings(
    text: str, root_logger: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = _log_two_records("json", text, monkeypatch).splitlines()
    assert len(lines) == 2  # one record, one line
    warning, failure = map(json.loads, lines)
    assert (warning["message"], warning["consumer"]) == (f"rejected: {text}", text)
    assert failure["message"] == f"handler failed on {text}"
    assert failure["exception"].endswith(f"ValueError: {text}")
    assert not acting_characters("".join(lines), keep="")


@given(text=hostile_text().filter(bool))  # an empty context value is left out
@LOG_EXAMPLES
def test_text_lines_escape_control_characters_so_no_line_is_forged(
    text: str, root_logger: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = _log_two_records("text", text, monkeypatch)
    records = [line for line in output.splitlines() if not line.startswith("  ")]
    assert len(records) == 2  # every other line is the exception's, indented
    assert records[0].endswith(f"rejected: {visible(text)} [consumer={visible(text)}]")
    assert records[1].endswith(f"handler failed on {visible(text)}")
    exception = visible(f"ValueError: {text}", multiline=True)
    assert "\n  ".join(exception.split("\n")).rstrip() in output
    assert not acting_characters(output)
