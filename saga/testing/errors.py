"""What goes wrong before a harness test can run: no server, a database that is not the
harness's to empty, a ``schema=`` entry that is neither a file nor SQL."""

from __future__ import annotations

from saga.errors import ConfigurationError


class HarnessSetupError(ConfigurationError):
    """The harness cannot get a test database, or cannot read the schema it was given;
    the message says what to do."""


class ForeignDatabase(HarnessSetupError):
    """The database named for the tests holds tables the harness did not create: emptying
    it before each test would delete them, so the harness refuses it and changes nothing."""
