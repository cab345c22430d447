"""Retention: deleting what is no longer needed, in small batches off the hot path.

- inbox rows, the replies kept with them and closed-step records older than the
  deduplication window,
- finished sagas (completed or compensated) and their step logs,
- dead letters already replayed or purged,
- replay history,
- claim checks past their expiry,
- events kept for a saga that would wait for them (``early_events``) that none did.

Each batch is its own short transaction, so pruning never holds locks that
relays and consumers wait on for long. Sagas that need an operator, pending
dead letters and outbox rows are never pruned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg

from saga.db.sql import Tx, render
from saga.errors import ConfigurationError

_INBOX = """
DELETE FROM {schema}.inbox WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {schema}.inbox WHERE received_at < now() - %s::interval LIMIT %s
))
"""

_INBOX_REPLIES = """
DELETE FROM {schema}.inbox_replies WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {schema}.inbox_replies WHERE sent_at < now() - %s::interval LIMIT %s
))
"""

_CLOSED_STEPS = """
DELETE FROM {schema}.closed_steps WHERE step_key = ANY(ARRAY(
    SELECT step_key FROM {schema}.closed_steps WHERE closed_at < now() - %s::interval LIMIT %s
))
"""

_SAGAS = """
WITH doomed AS (
    SELECT id FROM {schema}.saga_instances
    WHERE status IN ('completed', 'compensated') AND finished_at < now() - %s::interval
    ORDER BY finished_at LIMIT %s
    FOR UPDATE SKIP LOCKED
), steps AS (
    DELETE FROM {schema}.saga_steps WHERE saga_id IN (SELECT id FROM doomed)
)
DELETE FROM {schema}.saga_instances WHERE id IN (SELECT id FROM doomed)
"""

_DEAD_LETTERS = """
DELETE FROM {schema}.dead_letters WHERE id IN (
    SELECT id FROM {schema}.dead_letters
    WHERE status IN ('replayed', 'purged')
      AND coalesce(purged_at, last_replayed_at, last_failed_at) < now() - %s::interval
    LIMIT %s
)
"""

_REPLAYS = """
DELETE FROM {schema}.dead_letter_replays WHERE id IN (
    SELECT id FROM {schema}.dead_letter_replays WHERE replayed_at < now() - %s::interval LIMIT %s
)
"""

_CLAIMS = """
DELETE FROM {schema}.claim_checks WHERE id IN (
    SELECT id FROM {schema}.claim_checks WHERE expires_at < now() - %s::interval LIMIT %s
)
"""

_EARLY_EVENTS = """
DELETE FROM {schema}.early_events WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {schema}.early_events WHERE received_at < now() - %s::interval LIMIT %s
))
"""

#: What pruning needs on each table (``FOR UPDATE`` on the sagas takes UPDATE).
_PRIVILEGES = (
    ("inbox", "DELETE"),
    ("inbox_replies", "DELETE"),
    ("closed_steps", "DELETE"),
    ("saga_instances", "UPDATE"),
    ("saga_instances", "DELETE"),
    ("saga_steps", "DELETE"),
    ("dead_letters", "DELETE"),
    ("dead_letter_replays", "DELETE"),
    ("claim_checks", "DELETE"),
    ("early_events", "DELETE"),
)

_MISSING_PRIVILEGES = """
SELECT privilege || ' on ' || name
FROM unnest(%b::text[], %b::text[]) AS needed (name, privilege)
WHERE NOT has_table_privilege(name, privilege)
"""

_COUNTS = {
    "inbox": "SELECT count(*) FROM {schema}.inbox WHERE received_at < now() - %s::interval",
    "inbox_replies": "SELECT count(*) FROM {schema}.inbox_replies "
    "WHERE sent_at < now() - %s::interval",
    "closed_steps": "SELECT count(*) FROM {schema}.closed_steps "
    "WHERE closed_at < now() - %s::interval",
    "sagas": "SELECT count(*) FROM {schema}.saga_instances WHERE status IN "
    "('completed', 'compensated') AND finished_at < now() - %s::interval",
    "dead_letters": "SELECT count(*) FROM {schema}.dead_letters WHERE status IN "
    "('replayed', 'purged') AND coalesce(purged_at, last_replayed_at, last_failed_at) "
    "< now() - %s::interval",
    "replays": "SELECT count(*) FROM {schema}.dead_letter_replays "
    "WHERE replayed_at < now() - %s::interval",
    "claim_checks": "SELECT count(*) FROM {schema}.claim_checks "
    "WHERE expires_at < now() - %s::interval",
    "early_events": "SELECT count(*) FROM {schema}.early_events "
    "WHERE received_at < now() - %s::interval",
}


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long each kind of row is kept.

    The deduplication window must be longer than dead-letter retention: a
    replayed letter can be replayed again while it is kept, and its inbox row
    must still be there to stop the second replay.
    """

    dedup_window: timedelta = timedelta(days=30)
    dead_letter_retention: timedelta = timedelta(days=14)
    saga_retention: timedelta = timedelta(days=30)
    #: how long an event no saga waited for yet is kept for one that will
    early_event_retention: timedelta = timedelta(days=7)
    batch_size: int = 5000

    def __post_init__(self) -> None:
        if self.dedup_window <= self.dead_letter_retention:
            raise ConfigurationError(
                f"the deduplication window ({self.dedup_window}) must be longer than "
                f"dead-letter retention ({self.dead_letter_retention}), or a replayed "
                "message could be applied twice"
            )
        if self.batch_size < 1:
            raise ConfigurationError("batch_size must be at least 1")


@dataclass(slots=True)
class PruneReport:
    deleted: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


class Pruner:
    """Runs the retention policy against one schema."""

    def __init__(self, schema: str, policy: RetentionPolicy | None = None) -> None:
        self.schema = schema
        self.policy = policy or RetentionPolicy()
        p = self.policy
        self._jobs: list[tuple[str, str, timedelta]] = [
            ("inbox", render(_INBOX, schema), p.dedup_window),
            ("inbox_replies", render(_INBOX_REPLIES, schema), p.dedup_window),
            ("closed_steps", render(_CLOSED_STEPS, schema), p.dedup_window),
            ("sagas", render(_SAGAS, schema), p.saga_retention),
            ("dead_letters", render(_DEAD_LETTERS, schema), p.dead_letter_retention),
            ("replays", render(_REPLAYS, schema), p.saga_retention),
            ("claim_checks", render(_CLAIMS, schema), timedelta(0)),
            ("early_events", render(_EARLY_EVENTS, schema), p.early_event_retention),
        ]
        self._counts = {k: (render(_COUNTS[k], schema), age) for k, _, age in self._jobs}

    def missing_privileges(self, tx: Tx) -> list[str]:
        """What this session's role lacks to prune (e.g. ``DELETE on saga.inbox``)."""
        names = [f"{self.schema}.{table}" for table, _ in _PRIVILEGES]
        privileges = [privilege for _, privilege in _PRIVILEGES]
        rows = tx.execute(_MISSING_PRIVILEGES, (names, privileges)).fetchall()
        return [row[0] for row in rows]

    def count(self, conn: psycopg.Connection[Any]) -> PruneReport:
        """What :meth:`prune` would delete now (a dry run)."""
        report = PruneReport()
        with conn.transaction():
            for kind, (query, age) in self._counts.items():
                row = conn.execute(query, (age,)).fetchone()
                report.deleted[kind] = int(row[0]) if row else 0
        return report

    def prune(
        self,
        conn: psycopg.Connection[Any],
        *,
        max_batches: int | None = None,
        on_progress: Callable[[str, int], None] | None = None,
    ) -> PruneReport:
        """Delete in batches until nothing is due (or ``max_batches`` per kind ran)."""
        report = PruneReport()
        size = self.policy.batch_size
        for kind, statement, age in self._jobs:
            report.deleted[kind] = 0
            batches = 0
            while max_batches is None or batches < max_batches:
                with conn.transaction():
                    deleted = conn.execute(statement, (age, size)).rowcount
                report.deleted[kind] += deleted
                batches += 1
                if on_progress:
                    on_progress(kind, deleted)
                if deleted < size:
                    break
        return report
