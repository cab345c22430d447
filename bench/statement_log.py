"""What the PostgreSQL server received, read from its own log.

A scratch database created with ``log_statement = 'all'`` set on it alone (no server
restart, no global setting) makes the server log every statement every later session
on it runs, with its parameters. :func:`log_window` collects those lines for some
databases while a block runs; :func:`parse` groups them into transactions per backend
(``BEGIN`` ... ``COMMIT``; a statement outside one is a transaction of its own). The
log must show the backend as ``[%p]`` and the database as ``user@%d`` in
``log_line_prefix`` (Debian's default does).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from bench.pgbench_script import Statement, Transaction

_ENTRY = re.compile(
    r"^.*?\[(?P<pid>\d+)\] (?:\S*@(?P<db>\S+) )?(?P<level>[A-Z]+):  (?P<message>.*)$"
)
_EXECUTE = re.compile(r"^(?:statement|execute [^:]+): (?P<sql>.*)$", re.DOTALL)
_PARAM = re.compile(r"\$(?P<n>\d+) = (?:NULL|'(?P<value>(?:[^']|'')*)')", re.DOTALL)


def server_log(conn: psycopg.Connection[Any]) -> Path:
    """The file the server writes its log to, readable from here (same host)."""
    row = conn.execute("SELECT pg_current_logfile(), current_setting('data_directory')").fetchone()
    if row and row[0]:
        path = Path(row[0]) if os.path.isabs(row[0]) else Path(row[1]) / row[0]
    else:  # logging_collector off: the postmaster's stderr
        pid_row = conn.execute("SELECT pg_read_file('postmaster.pid')").fetchone()
        pid = int(str(pid_row[0]).split()[0]) if pid_row else 0
        path = Path(os.readlink(f"/proc/{pid}/fd/2"))
    if not os.access(path, os.R_OK):
        raise RuntimeError(f"the server log {path} is not readable from this process")
    return path


@contextmanager
def log_window(admin_url: str, databases: list[str]) -> Iterator[list[str]]:
    """Collects what the server logged for the databases named inside the block (lines
    appended when it ends)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        path = server_log(conn)
    start = path.stat().st_size
    lines: list[str] = []
    yield lines
    with path.open("rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    names = set(databases)
    keep = False
    for line in text.splitlines():
        if line.startswith("\t"):
            if keep:
                lines.append(line)
            continue
        match = _ENTRY.match(line)
        keep = bool(match and match["db"] in names)
        if keep:
            lines.append(line)


def parse(lines: list[str]) -> list[Transaction]:
    """Transactions, in the order they began, from log lines (continuations start with a tab)."""
    entries: list[tuple[int, str, str, str]] = []
    for line in lines:
        if line.startswith("\t") and entries:
            pid, db, level, message = entries[-1]
            entries[-1] = (pid, db, level, f"{message}\n{line[1:]}")
            continue
        match = _ENTRY.match(line)
        if match:
            entries.append((int(match["pid"]), match["db"], match["level"], match["message"]))
    done: list[Transaction] = []
    open_: dict[int, Transaction] = {}
    last: dict[int, Statement] = {}
    for pid, db, level, message in entries:
        if level == "DETAIL" and message.startswith("parameters: ") and pid in last:
            params: dict[int, str | None] = {}
            for m in _PARAM.finditer(message):
                value = m["value"]
                params[int(m["n"])] = None if value is None else value.replace("''", "'")
            last[pid].params = [params.get(i + 1) for i in range(max(params, default=0))]
            continue
        executed = _EXECUTE.match(message) if level == "LOG" else None
        if not executed:
            continue
        statement = Statement(executed["sql"].strip())
        last[pid] = statement
        word = statement.sql.split(None, 1)[0].upper().rstrip(";") if statement.sql else ""
        if word in ("BEGIN", "START"):
            open_[pid] = Transaction(db, pid, [statement])
            done.append(open_[pid])
        elif pid in open_:
            open_[pid].statements.append(statement)
            if word in ("COMMIT", "END", "ROLLBACK") and "TO" not in statement.sql.upper():
                del open_[pid]
        else:
            done.append(Transaction(db, pid, [statement]))
    return done
