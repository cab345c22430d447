"""Closed steps: a participant's record of the saga steps it has compensated.

A compensation closes the step it undoes (``compensates`` header) in the same
transaction as its own writes. A forward command for a closed step is never
executed: it is a replay, or a redelivery that its compensation overtook.

Both sides take a transaction-level advisory lock on the step key (the forward
command shared, the compensation exclusive), so a compensation that arrives while
its command is being handled waits for that transaction and then sees, and undoes,
what it wrote; and a command that arrives while its compensation is being handled
waits, then finds the step closed. The command's shared lock is taken, and its step
looked up in a fresh snapshot once the lock is granted, in the consumer's opening
statement (:mod:`saga.consumers.inbox`, the schema's ``closed_steps_locked`` function).
"""

from __future__ import annotations

from datetime import datetime

from saga.db.sql import Tx, render

#: Seed of the advisory-lock hash: keeps step-key locks apart from other advisory locks.
LOCK_SEED = 0x5A6A_C105

_FIND = "SELECT step_key, closed_at FROM {schema}.closed_steps WHERE step_key = ANY(%b::text[])"

_CLOSE = """
WITH locked AS (SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, %(seed)s)))
INSERT INTO {schema}.closed_steps (step_key, consumer)
SELECT %(key)s, %(consumer)s FROM locked
ON CONFLICT DO NOTHING
"""


class ClosedSteps:
    """Closed-step records on one schema, on the caller's transaction."""

    def __init__(self, schema: str) -> None:
        self._find = render(_FIND, schema)
        self._close = render(_CLOSE, schema)

    def find(self, tx: Tx, keys: list[str]) -> dict[str, datetime]:
        """Of ``keys``, the closed ones, with when each was closed."""
        return dict(tx.execute(self._find, (keys,), prepare=True).fetchall())

    def close(self, tx: Tx, consumer: str, key: str) -> None:
        """Record ``key`` closed, after any open transaction running its command."""
        tx.execute(self._close, {"key": key, "seed": LOCK_SEED, "consumer": consumer})
