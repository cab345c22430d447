"""``python -m bench.lone_transaction``: what a delivery alone in its transaction costed, and
what pipelining its statements would have saved.

Until 2026-12-03 a participant's delivery handled alone was eleven commands of the
framework around the handler's own (four now, none to publish: ``bench.lone_delivery``
counts them from the server's log): BEGIN, the inbox row, the shared step-key lock, the
closed-steps read, a savepoint, (the handler), the outbox row, the kept reply, COMMIT;
then the publish after commit: BEGIN, the outbox row taken, (the AMQP publish), COMMIT.
This replays those
statement shapes on tables of its own (no broker, no handler beyond one business
update), one connection, and reads the client's and the server backend's CPU per
transaction: once as the consumer sent them (a round trip each), once with
psycopg's pipeline mode (the same statements in four round trips). It also times single
commands, to split a statement's cost between psycopg and the server. Results:
``bench/results/lone-transaction-latest.md`` (and ``.json``).
"""

from __future__ import annotations

import argparse
import functools
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from bench import report
from bench.environment import ScratchDatabase, machine
from bench.profile import process_cpu

BODY = b"x" * 400

_TABLES = """
CREATE TABLE inbox (consumer text, message_id uuid, PRIMARY KEY (consumer, message_id));
CREATE TABLE outbox (id bigserial PRIMARY KEY, message_id uuid, body bytea,
                     deliver_after timestamptz);
CREATE TABLE replies (consumer text, message_id uuid, reply_id uuid, body bytea,
                      PRIMARY KEY (consumer, message_id, reply_id));
CREATE TABLE closed_steps (step_key text PRIMARY KEY);
CREATE TABLE business (id int PRIMARY KEY, n int);
INSERT INTO business SELECT g, 0 FROM generate_series(1, 100) g;
"""
INBOX = (
    "INSERT INTO inbox SELECT %s, unnest(%b::uuid[]) ON CONFLICT DO NOTHING RETURNING message_id"
)
LOCK = (
    "SELECT count(pg_advisory_xact_lock_shared(hashtextextended(k, %s)))"
    " FROM (SELECT DISTINCT unnest(%b::text[]) AS k ORDER BY 1) AS keys"
)
CLOSED = "SELECT step_key FROM closed_steps WHERE step_key = ANY(%b::text[])"
BUSINESS = "UPDATE business SET n = n + 1 WHERE id = %s RETURNING n"
OUTBOX = "INSERT INTO outbox (message_id, body) VALUES (%s, %s) RETURNING id"
REPLY = (
    "INSERT INTO replies SELECT %s, * FROM unnest(%b::uuid[], %b::uuid[], %b::bytea[])"
    " ON CONFLICT DO NOTHING"
)
TAKE = (
    "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE id = ANY(%b::bigint[])"
    " AND deliver_after IS NULL FOR UPDATE SKIP LOCKED) RETURNING id, body"
)


def one_by_one(conn: psycopg.Connection[Any], i: int) -> None:
    """The commands as the consumer sends them: a round trip each."""
    message, reply = uuid.uuid4(), uuid.uuid4()
    with conn.transaction():
        conn.execute(INBOX, ("c", [message]), prepare=True).fetchall()
        conn.execute(LOCK, (1, [str(message)]), prepare=True)
        conn.execute(CLOSED, ([str(message)],), prepare=True).fetchall()
        conn.execute("SAVEPOINT segment", prepare=False)
        conn.execute(BUSINESS, (i % 100 + 1,)).fetchone()
        row = conn.execute(OUTBOX, (reply, BODY), prepare=True).fetchone()
        conn.execute(REPLY, ("c", [message], [reply], [BODY]), prepare=True)
    assert row is not None
    with conn.transaction():
        conn.execute(TAKE, ([row[0]],), prepare=True).fetchall()


def pipelined(conn: psycopg.Connection[Any], i: int) -> None:
    """The same commands in four round trips (the handler's statement outside the pipeline)."""
    message, reply = uuid.uuid4(), uuid.uuid4()
    with conn.pipeline():
        conn.execute("BEGIN")
        fresh = conn.execute(INBOX, ("c", [message]), prepare=True)
        conn.execute(LOCK, (1, [str(message)]), prepare=True)
        closed = conn.execute(CLOSED, ([str(message)],), prepare=True)
        conn.execute("SAVEPOINT segment", prepare=False)
        fresh.fetchall(), closed.fetchall()
    conn.execute(BUSINESS, (i % 100 + 1,)).fetchone()
    with conn.pipeline():
        written = conn.execute(OUTBOX, (reply, BODY), prepare=True)
        conn.execute(REPLY, ("c", [message], [reply], [BODY]), prepare=True)
        conn.execute("COMMIT")
        row = written.fetchone()
    assert row is not None
    with conn.pipeline():
        conn.execute("BEGIN")
        conn.execute(TAKE, ([row[0]],), prepare=True).fetchall()
    conn.execute("COMMIT")


def _measure(
    conn: psycopg.Connection[Any], backend: int, run: Callable[[int], object], count: int
) -> tuple[float, float, float]:
    """Wall, client CPU and server CPU microseconds per call of ``run``."""
    wall, client, server = time.perf_counter(), time.process_time(), process_cpu(backend)
    for i in range(count):
        run(i)
    return (
        (time.perf_counter() - wall) / count * 1e6,
        (time.process_time() - client) / count * 1e6,
        (process_cpu(backend) - server) / count * 1e6,
    )


def _row(name: str, measured: tuple[float, float, float]) -> tuple[str, str, str]:
    wall, client, server = measured
    return name, f"client {client:.0f} µs, server {server:.0f} µs of CPU", f"wall {wall:.0f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=3_000, help="per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each kind, alternated")
    args = parser.parse_args()
    database = ScratchDatabase.create("saga_bench_lone", framework=False)
    try:
        with psycopg.connect(database.url, autocommit=True) as conn:
            conn.execute(_TABLES)
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            backend = row[0]
            singles: dict[str, Callable[[int], object]] = {
                "SELECT, prepared, psycopg": lambda i: conn.execute(
                    "SELECT %s::int", (i,), prepare=True
                ).fetchone(),
                "SELECT, libpq exec alone": lambda i: conn.pgconn.exec_(b"SELECT 1"),
                "BEGIN + COMMIT, psycopg": lambda i: (
                    conn.execute("BEGIN"),
                    conn.execute("COMMIT"),
                ),
            }
            rows: list[tuple[str, str, str]] = []
            figures: dict[str, float] = {}
            for name, single in singles.items():
                rows.append(_row(name, _measure(conn, backend, single, args.transactions)))
            for round_ in range(1, args.rounds + 1):
                for key, shape in (("one_by_one", one_by_one), ("pipelined", pipelined)):
                    run = functools.partial(shape, conn)
                    measured = _measure(conn, backend, run, args.transactions)
                    label = key.replace("_", " ")
                    rows.append(_row(f"lone delivery, {label} (run {round_})", measured))
                    figures[f"{key}_client_us_run{round_}"] = round(measured[1])
                    figures[f"{key}_server_us_run{round_}"] = round(measured[2])
            print(report.write(figures, rows, machine(), name="lone-transaction").read_text())
    finally:
        database.drop()


if __name__ == "__main__":
    main()
