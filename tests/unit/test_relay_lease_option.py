"""How long a relay's batch stays its own: a positive lease, from the options or the CLI."""

from __future__ import annotations

from datetime import timedelta

import pytest
from typer.testing import CliRunner

from saga.cli.app import app
from saga.errors import ConfigurationError
from saga.messaging.leases import DEFAULT_LEASE
from saga.outbox_relay.relay import RelayOptions


def test_a_relay_leases_its_batches_for_the_consumers_default_unless_told() -> None:
    assert RelayOptions().lease == DEFAULT_LEASE
    assert RelayOptions(lease=timedelta(seconds=30)).lease == timedelta(seconds=30)


@pytest.mark.parametrize("lease", [timedelta(0), timedelta(seconds=-1)])
def test_a_lease_that_is_not_positive_is_refused_with_its_value(lease: timedelta) -> None:
    with pytest.raises(ConfigurationError, match="a relay's lease must be positive"):
        RelayOptions(lease=lease)


def test_saga_relay_refuses_a_lease_of_zero_before_connecting_anywhere() -> None:
    result = CliRunner().invoke(app, ["relay", "--lease", "0"])
    assert result.exit_code == 2, result.output
    assert "--lease" in result.output
