"""What holds back vacuum on a database: the oldest transaction that keeps a snapshot
(or a transaction id) open, and the dead tuples piling up behind it in the framework's
tables.

A transaction that holds a snapshot (a report, a ``pg_dump``, a migration, a psql
window left ``idle in transaction``) keeps vacuum from reclaiming any row deleted after
it began, on every table of its database. The outbox, the inbox and the PostgreSQL
broker's messages table delete rows all day: their dead tuples grow for as long as it
lasts. Read by ``saga stats``, the dashboard and the metrics; a consumer of the
PostgreSQL broker logs a warning past :data:`WARN_AFTER`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from saga.db.sql import Tx

logger = logging.getLogger(__name__)

#: Seconds a transaction may hold back vacuum before a warning is logged.
WARN_AFTER = 300.0

# Sessions of other roles show their xmin but hide what they run unless the reader has
# pg_read_all_stats: the age, client and state then read as unknown.
_OLDEST = """
SELECT extract(epoch FROM now() - xact_start)::float8, pid, usename, application_name,
       client_addr::text, state
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
  AND backend_type = 'client backend'
ORDER BY greatest(age(backend_xmin), age(backend_xid)) DESC NULLS LAST, xact_start
LIMIT 1
"""

_DEAD_TUPLES = """
SELECT schemaname || '.' || relname, n_dead_tup FROM pg_stat_user_tables
WHERE schemaname = ANY(%b) ORDER BY n_dead_tup DESC, 1
"""


@dataclass(frozen=True, slots=True)
class HeldTransaction:
    """The session whose transaction is the oldest still open on a database."""

    age_s: float | None
    pid: int
    user: str | None
    application: str | None
    client: str | None
    state: str | None

    def describe(self) -> str:
        age = "unknown" if self.age_s is None else f"{self.age_s:.0f}s"
        who = self.application or "?"
        where = self.client or "local socket"
        return f"pid {self.pid}, {age}, {self.user or '?'} via {who!r} from {where}, {self.state}"


@dataclass(frozen=True, slots=True)
class VacuumHorizon:
    """One database: its oldest open transaction (None: none but this reader's) and the
    dead tuples of the framework's tables (``schema.table`` -> count)."""

    oldest: HeldTransaction | None
    dead_tuples: dict[str, int] = field(default_factory=dict)


def read_vacuum_horizon(tx: Tx, schemas: Sequence[str]) -> VacuumHorizon:
    """The vacuum horizon of ``tx``'s database; dead tuples of the tables in ``schemas``."""
    row = tx.execute(_OLDEST).fetchone()
    oldest = HeldTransaction(*row) if row else None
    dead = {name: int(n) for name, n in tx.execute(_DEAD_TUPLES, (list(schemas),))}
    return VacuumHorizon(oldest, dead)


def warn_if_held(horizon: VacuumHorizon, database: str, threshold: float = WARN_AFTER) -> bool:
    """Log a warning when a transaction has held back vacuum for over ``threshold`` s."""
    held = horizon.oldest
    if held is None or held.age_s is None or held.age_s < threshold:
        return False
    logger.warning(
        "a transaction has held back vacuum on the %s for %.0f s (%s): rows deleted since "
        "it began cannot be reclaimed; end it, or set idle_in_transaction_session_timeout "
        "(docs/operations.md, Transactions that hold back vacuum)",
        database,
        held.age_s,
        held.describe(),
        extra={"held_pid": held.pid, "held_age_s": held.age_s},
    )
    return True
