"""Settling messages taken under a lease: the ack's delete and the release, each fenced
by the lock token of the claim (a consumer whose lease ran out cannot touch what another
now holds), and each addressed to the generation's partition the claim found the
message in.

A statement on the whole table opens and probes every generation's partition and its
indexes for each id; one on the message's partition, only that one. A message the
rotation moved to the current generation under its lease
(:mod:`saga.broker.postgres.rotation`) is not found there: the deliveries of a
generation where some were not found are settled through the whole table, in a second
statement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from saga.broker.postgres.messages import partition

#: The messages fenced by (id, lock token). ``m.id = ANY(...)`` (the ids again) lets a
#: partition be probed by its primary key: the join alone is planned as a scan of every
#: partition whenever the estimates are off.
_FENCED = (
    "unnest(%b::bigint[], %b::uuid[]) AS s(id, token) "
    "WHERE m.id = s.id AND m.lock_token = s.token AND m.id = ANY(%b::bigint[])"
)
DELETE = "DELETE FROM {t} m USING " + _FENCED
RELEASE = (
    "UPDATE {t} m SET visible_at = now() + %s * interval '1 second', lock_token = NULL FROM "
    + _FENCED
)


#: A message taken: its id, the claim's lock token, and its generation when taken. A
#: plain tuple: a consumer makes one per message.
Delivery = tuple[int, str, int]


def delivery_tag(row_id: int, token: str, generation: int) -> str:
    """The tag of a message taken, read back by :func:`delivery_of`."""
    return f"{row_id}:{token}:{generation}"


def delivery_of(tag: str) -> Delivery:
    row_id, token, generation = tag.split(":")
    return int(row_id), token, int(generation)


def settle(
    db: psycopg.Connection[Any],
    schema: str,
    statement: str,
    deliveries: Sequence[Delivery],
    leading: tuple[Any, ...] = (),
) -> None:
    """Run ``statement`` (:data:`DELETE` or :data:`RELEASE`, after ``leading``
    parameters) on ``deliveries``: per generation on its partition, then on the whole
    table for the generations where some were not found (moved, or their lease lost)."""
    by_generation: dict[int, list[Delivery]] = defaultdict(list)
    for delivery in deliveries:
        by_generation[delivery[2]].append(delivery)
    left: list[Delivery] = []
    for generation, group in by_generation.items():
        query = sql.SQL(statement).format(t=partition(schema, generation))
        if db.execute(query, (*leading, *_fenced(group))).rowcount < len(group):
            left += group  # those settled already match nothing the second time
    if left:
        query = sql.SQL(statement).format(t=sql.Identifier(schema, "messages"))
        db.execute(query, (*leading, *_fenced(left)))


def _fenced(deliveries: Sequence[Delivery]) -> tuple[list[int], list[str], list[int]]:
    ids = [delivery[0] for delivery in deliveries]
    return ids, [delivery[1] for delivery in deliveries], ids
