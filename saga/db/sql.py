"""SQL helpers: the transaction type, names checked before SQL or topology use them, templates."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import sql

from saga.errors import InvalidIdentifier

#: A connection inside a transaction the caller owns: the callee reads and writes on it
#: and never commits, rolls back or closes it (a parameter of this type is named ``tx``).
#: A connection the callee manages itself is a plain ``psycopg.Connection[Any]``, named
#: ``conn`` (docs/architecture.md, "Connections and transactions").
Tx = psycopg.Connection[Any]
#: :data:`Tx` on an asynchronous connection.
AsyncTx = psycopg.AsyncConnection[Any]

_SQL_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,199}$")


def validate_schema(name: str) -> str:
    """Return ``name`` if it is a plain lower-case PostgreSQL identifier."""
    if not isinstance(name, str) or not _SQL_IDENTIFIER.match(name):
        raise InvalidIdentifier(
            f"schema name {name!r} is not a valid identifier: use 1-63 characters "
            "from a-z, 0-9 and _, not starting with a digit"
        )
    return name


def validate_name(name: str, what: str) -> str:
    """Return ``name`` if it is usable as a service, consumer or queue name."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidIdentifier(
            f"{what} {name!r} is not valid: use 1-200 characters from letters, "
            "digits and _ . : -, starting with a letter, digit or _"
        )
    return name


@lru_cache(maxsize=512)
def render(template: str, schema: str) -> str:
    """Render a SQL template whose ``{schema}`` placeholder names our schema.

    The schema is validated and quoted with :mod:`psycopg.sql`; the result is
    cached, so hot paths pay for composition once.
    """
    composed = sql.SQL(template).format(schema=sql.Identifier(validate_schema(schema)))
    return composed.as_string(None)
