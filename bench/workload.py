"""The business writes every peer measurement repeats: one row updated, one row logged.

A saga step's transaction updates a business row and records what it did; the peers do the
same two statements in one transaction, so the figures compare orchestration, not SQL.
"""

from __future__ import annotations

import psycopg

ACCOUNTS = 10_000

SCHEMA = """
CREATE TABLE accounts (id integer PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
CREATE TABLE step_log (
    run     integer     NOT NULL,
    step    integer     NOT NULL,
    done_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

# Parameters: an account id in [1, ACCOUNTS], then (run, step).
UPDATE = "UPDATE accounts SET balance = balance + 1 WHERE id = %s"
LOG = "INSERT INTO step_log (run, step) VALUES (%s, %s)"


def create_tables(url: str, accounts: int = ACCOUNTS) -> None:
    """The business table with ``accounts`` rows, and the log each step appends to."""
    with psycopg.connect(url) as conn:
        conn.execute(SCHEMA)
        conn.execute("INSERT INTO accounts (id) SELECT generate_series(1, %s)", (accounts,))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE accounts")


def finished(url: str, step: int) -> int:
    """How many runs have committed ``step``."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM step_log WHERE step = %s", (step,)).fetchone()
    return int(row[0]) if row else 0
