"""A captured transaction's SQL, replayed by pgbench: the script writer of the saga SQL ceiling.

See :mod:`bench.saga_sql_ceiling` for the capture and the replay. Here: the statements and
transactions read from the server log, the business keys the replay varies, and
:func:`script`, which renders one database's share as a pgbench script.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

_PLACEHOLDER = re.compile(r"\$(\d+)\b")
UUID_PATTERN = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
INT_ARRAY = re.compile(r"^\{?(\d+(?:,\d+)*)\}?$")
_VARIABLE = re.compile(r"(?<!:):([A-Za-z_]\w*)")


@dataclass
class Statement:
    sql: str
    params: list[str | None] = field(default_factory=list)


@dataclass
class Transaction:
    database: str
    pid: int
    statements: list[Statement]

    def text(self) -> str:
        """Every statement and parameter value, to search for the saga's tokens."""
        return "\n".join("\n".join([s.sql, *(p for p in s.params if p)]) for s in self.statements)

    @property
    def work(self) -> int:
        """Statements other than transaction control (``BEGIN``, ``COMMIT``)."""
        return sum(1 for s in self.statements if not _control(s.sql))


@dataclass(frozen=True)
class Key:
    """A business value of the captured saga that the replay must vary as the benchmark does.

    ``literal`` is the value a parameter had (the whole parameter), ``draw`` a pgbench
    ``\\set`` expression, ``text`` SQL giving the replayed value as text from ``:{var}``.
    """

    literal: str
    draw: str
    text: str = ":{var}::text"


def parameter_types(url: str, statements: list[Statement]) -> dict[str, list[str] | None]:
    """The type PostgreSQL infers for each parameter of each statement (None: it cannot)."""
    types: dict[str, list[str] | None] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            if not statement.params or statement.sql in types:
                continue
            try:
                conn.execute(sql.SQL("PREPARE bench_probe AS {}").format(sql.SQL(statement.sql)))
                row = conn.execute(
                    "SELECT parameter_types::text[] FROM pg_prepared_statements "
                    "WHERE name = 'bench_probe'"
                ).fetchone()
                conn.execute("DEALLOCATE bench_probe")
                types[statement.sql] = list(row[0]) if row else None
            except psycopg.Error:
                types[statement.sql] = None
    return types


def _literal(value: str) -> str:
    """A string literal pgbench leaves alone (a colon would read as a variable)."""
    if ":" not in value and "\\" not in value:
        return "'" + value.replace("'", "''") + "'"
    escaped = value.replace("\\", "\\\\").replace("'", "''").replace(":", "\\x3a")
    return f"E'{escaped}'"


def _compared_with_ids(sql: str, placeholder: int) -> bool:
    """Whether ``$placeholder`` in ``sql`` stands for row ids: ``id = $n`` or
    ``id = ANY($n ...)``."""
    return re.search(rf"\bid\s*=\s*(?:ANY\s*\(\s*)?\${placeholder}(?!\d)", sql) is not None


def _control(statement: str) -> bool:
    word = statement.split(None, 1)[0].upper().rstrip(";") if statement else ""
    return word in ("BEGIN", "START", "COMMIT", "END", "ROLLBACK")


class _Script:
    """Renders one database's share; the same UUID or row id always gets the same variable."""

    def __init__(self, keys: list[Key], ids: dict[int, str], types: dict[str, list[str] | None]):
        self.keys = {k.literal: (f"k{i + 1}", k) for i, k in enumerate(keys)}
        self.uuids: dict[str, int] = {}
        self.ids = ids
        self.message_of = {m: i for i, m in ids.items()}
        self.row_vars: dict[int, str] = {}
        self.types = types
        self.used_keys: set[str] = set()

    def _uuid(self, value: str) -> str:
        """The replayed UUID standing for ``value``, as uuid (parameters take it as text)."""
        n = self.uuids.setdefault(value, len(self.uuids) + 1)
        return f"md5(:saga::text || '/{n}')::uuid"

    def _row_id(self, row: int) -> str:
        if row in self.row_vars:
            return f":{self.row_vars[row]}::text"
        return f"(SELECT id FROM saga.outbox WHERE message_id = {self._uuid(self.ids[row])})::text"

    def _text(self, value: str, outbox: bool) -> str:
        """SQL text expression for a captured parameter value."""
        if value in self.keys:
            var, key = self.keys[value]
            self.used_keys.add(value)
            return key.text.format(var=var)
        match = INT_ARRAY.match(value) if outbox else None
        rows = [int(r) for r in match[1].split(",")] if match else []
        if rows and all(r in self.ids for r in rows):
            inner = " || ',' || ".join(self._row_id(r) for r in rows)
            return f"('{{' || {inner} || '}}')" if value.startswith("{") else inner
        pieces, at = [], 0
        for m in UUID_PATTERN.finditer(value):
            if m.start() > at:
                pieces.append(_literal(value[at : m.start()]))
            pieces.append(f"{self._uuid(m.group())}::text")
            at = m.end()
        if at < len(value) or not pieces:
            pieces.append(_literal(value[at:]))
        return pieces[0] if len(pieces) == 1 else "(" + " || ".join(pieces) + ")"

    def statement(self, statement: Statement) -> str:
        types = self.types.get(statement.sql) or []
        outbox = "outbox" in statement.sql
        rendered = []
        for i, value in enumerate(statement.params):
            type_ = types[i] if i < len(types) else ""
            cast = f"::{type_}" if type_ and type_ != "unknown" else ""
            if value is None:
                rendered.append(f"NULL{cast}")
            else:
                # an outbox row's id is a bigint compared with an ``id`` column: an integer
                # of another type (an attempt number) or another use (the counts of the
                # unrouted events beside a delete of rows) is left as it is
                ids = (
                    outbox
                    and type_ in ("bigint", "bigint[]", "", "unknown")
                    and _compared_with_ids(statement.sql, i + 1)
                )
                text = self._text(value, ids)
                rendered.append(f"({text}){cast}" if cast else text)
        text = _PLACEHOLDER.sub(lambda m: rendered[int(m[1]) - 1], statement.sql)
        inserted = self._inserted_rows(statement)
        if len(inserted) == 1 and re.search(r"RETURNING\s+(\w+\s*,\s*)*id\b", text, re.I):
            prefix = f"ob{len(self.row_vars) + 1}_"
            self.row_vars[inserted[0]] = f"{prefix}id"
            return f"{text.rstrip().rstrip(';')}\n\\gset {prefix}"
        return text.rstrip().rstrip(";") + ";"

    def _inserted_rows(self, statement: Statement) -> list[int]:
        if not re.match(r"\s*INSERT\s+INTO\s+\S*outbox\b", statement.sql, re.I):
            return []
        found = {u for v in statement.params if v for u in UUID_PATTERN.findall(v)}
        return [self.message_of[m] for m in found if m in self.message_of]

    def header(self) -> str:
        lines = ["\\set saga random(1, 1000000000000000000)"]
        for literal in sorted(self.used_keys):
            var, key = self.keys[literal]
            lines.append(f"\\set {var} {key.draw}")
        return "\n".join(lines)


def script(transactions: list[Transaction], keys: list[Key], ids: dict[int, str], url: str) -> str:
    """The pgbench script replaying ``transactions`` on the database at ``url``."""
    statements = [s for tx in transactions for s in tx.statements]
    render = _Script(keys, ids, parameter_types(url, statements))
    body = "\n\n".join("\n".join(render.statement(s) for s in tx.statements) for tx in transactions)
    text = f"{render.header()}\n\n{body}\n"
    defined = {"saga", *(v for v, _ in render.keys.values()), *render.row_vars.values()}
    stray = {m[1] for m in _VARIABLE.finditer(text.replace("\\gset", ""))} - defined
    if stray:
        raise RuntimeError(f"the captured SQL uses colons pgbench would read: {sorted(stray)}")
    return text
