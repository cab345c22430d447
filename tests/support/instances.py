"""Starting a saga on the test database and waiting for it to reach a status.

The start commits on its own, as an application's transaction would, so the consumers
running beside the test see the saga's first messages.
"""

from __future__ import annotations

from typing import TypeVar
from uuid import UUID

from pydantic import BaseModel

from saga import Saga
from tests.support.databases import TestDatabase
from tests.support.wait import wait_until

D = TypeVar("D", bound=BaseModel)

STATUS = "SELECT status FROM saga.saga_instances WHERE id = %s"


def start(db: TestDatabase, saga: Saga[D], data: D) -> UUID:
    """Start ``saga`` with ``data`` in a transaction of its own; its id."""
    with db.connect(autocommit=False) as conn, conn.transaction():
        return saga.start(conn, data)


def settled(db: TestDatabase, saga_id: UUID, status: str, *, timeout: float = 30) -> None:
    """Wait until the saga ``saga_id`` is at ``status``; fail after ``timeout`` seconds."""
    wait_until(lambda: db.scalar(STATUS, (saga_id,)) == status, timeout=timeout, what=status)
