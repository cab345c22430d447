"""A service whose handler logs the database URL it runs with, password and all, as
application code may: only the process's log redaction stands between it and the log
(tests/acceptance/test_secrets.py)."""

from __future__ import annotations

import logging
import os
from typing import Any

from saga import HandlerContext, Service
from tests.support.services import Ping

logger = logging.getLogger(__name__)

leaky = Service("leaky")


@leaky.handler(Ping)
def log_the_url(tx: Any, msg: Ping, ctx: HandlerContext) -> None:
    logger.warning("handling %s on %s", msg.key, os.environ["SAGA_DATABASE_URL"])
