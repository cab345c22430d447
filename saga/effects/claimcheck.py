"""Claim checks: keep large payloads out of messages and saga data.

Store the content once, carry only its id::

    claims = ClaimCheck()                       # PostgreSQL table saga.claim_checks
    with conn.transaction():
        doc_id = claims.put_json(conn, big_document, expires_in=timedelta(days=30))
        loan.start(conn, LoanData(loan_id="l1", document_id=str(doc_id)))

    # later, in a handler or local step, in its transaction
    document = claims.get_json(tx, UUID(data.document_id))

Any store with the :class:`ClaimStore` methods can be plugged in (an object
store, for instance); the default writes to the service's own database, so a
claim check commits or rolls back with the transaction that writes it.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, Protocol
from uuid import UUID

from saga.db.sql import Tx, render
from saga.errors import ClaimNotFound
from saga.messaging.ids import uuid7

_PUT = """
INSERT INTO {schema}.claim_checks (id, content_type, content, expires_at)
VALUES (%s, %s, %s, now() + %s::interval)
"""
_GET = "SELECT content, content_type FROM {schema}.claim_checks WHERE id = %s"
_DELETE = "DELETE FROM {schema}.claim_checks WHERE id = %s"


class ClaimStore(Protocol):
    """Where claim-checked content lives."""

    def put(
        self,
        tx: Tx,
        content: bytes,
        content_type: str,
        expires_in: timedelta | None,
    ) -> UUID: ...

    def get(self, tx: Tx, claim_id: UUID) -> tuple[bytes, str]: ...

    def delete(self, tx: Tx, claim_id: UUID) -> None: ...


class PostgresClaimStore:
    """Claim checks in the ``claim_checks`` table of the framework's schema."""

    def __init__(self, schema: str = "saga") -> None:
        self._put = render(_PUT, schema)
        self._get = render(_GET, schema)
        self._delete = render(_DELETE, schema)

    def put(
        self,
        tx: Tx,
        content: bytes,
        content_type: str,
        expires_in: timedelta | None,
    ) -> UUID:
        claim_id = uuid7()
        tx.execute(self._put, (claim_id, content_type, content, expires_in))
        return claim_id

    def get(self, tx: Tx, claim_id: UUID) -> tuple[bytes, str]:
        row = tx.execute(self._get, (claim_id,)).fetchone()
        if row is None:
            raise ClaimNotFound(f"no claim check {claim_id}")
        content, content_type = row
        return bytes(content), str(content_type)

    def delete(self, tx: Tx, claim_id: UUID) -> None:
        tx.execute(self._delete, (claim_id,))


class ClaimCheck:
    """Put and get large content by id, through a pluggable :class:`ClaimStore`."""

    def __init__(self, store: ClaimStore | None = None) -> None:
        self.store = store or PostgresClaimStore()

    def put(
        self,
        tx: Tx,
        content: bytes,
        content_type: str = "application/octet-stream",
        expires_in: timedelta | None = None,
    ) -> UUID:
        return self.store.put(tx, content, content_type, expires_in)

    def get(self, tx: Tx, claim_id: UUID) -> bytes:
        return self.store.get(tx, claim_id)[0]

    def put_json(self, tx: Tx, value: Any, expires_in: timedelta | None = None) -> UUID:
        return self.put(tx, json.dumps(value).encode(), "application/json", expires_in)

    def get_json(self, tx: Tx, claim_id: UUID) -> Any:
        return json.loads(self.get(tx, claim_id))

    def delete(self, tx: Tx, claim_id: UUID) -> None:
        self.store.delete(tx, claim_id)
