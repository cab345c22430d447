"""Reading ``SAGA_FAULTS``: kill on the n-th hit, or hold there until a file exists."""

from __future__ import annotations

import pytest

from saga.errors import ConfigurationError
from saga.faults import RELEASE_VAR, Armed, _parse


def test_points_kill_on_their_nth_hit_or_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RELEASE_VAR, "/tmp/release")
    assert _parse("relay.after_claim, consumer.after_commit@3,relay.after_publish@2:hold") == {
        "relay.after_claim": Armed(1, hold=False),
        "consumer.after_commit": Armed(3, hold=False),
        "relay.after_publish": Armed(2, hold=True),
    }
    assert _parse("") == {}


def test_a_hold_needs_its_release_file_and_actions_are_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(RELEASE_VAR, raising=False)
    with pytest.raises(ConfigurationError, match=RELEASE_VAR):
        _parse("relay.after_publish:hold")
    with pytest.raises(ConfigurationError, match="no action 'pause'"):
        _parse("relay.after_publish:pause")
