"""``deliver_after`` when the application's clock is ahead of or behind the database's.

An absolute time is an instant: it is stored as given (whatever its time zone) and
released when the database's clock reaches it, so an application whose clock is off
computes the wrong instant, and a timedelta (measured on the database's clock from
the transaction's start) is the way to say "in a minute" that no skew moves. A
datetime without a time zone names no instant and is refused.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel

from saga import Outbox
from saga.errors import ConfigurationError
from saga.outbox_relay import Relay, RelayOptions
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase
from tests.support.wait import wait_until

SKEW = timedelta(hours=1)


class Note(BaseModel):
    text: str


def _db_now(db: TestDatabase) -> datetime:
    return db.scalar("SELECT clock_timestamp()")  # type: ignore[no-any-return]


TEXT = "convert_from(body, 'UTF8')::jsonb -> 'payload' ->> 'text'"


def _waiting(db: TestDatabase) -> set[str]:
    """The notes still in the outbox."""
    return {row[0] for row in db.rows(f"SELECT {TEXT} FROM saga.outbox")}


def _due(db: TestDatabase, text: str) -> Any:
    return db.scalar(f"SELECT deliver_after FROM saga.outbox WHERE {TEXT} = %s", (text,))


def test_absolute_times_are_instants_on_the_databases_clock_and_delays_ignore_skew(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    outbox = Outbox()
    real = _db_now(db)
    ahead = real + SKEW  # what an application whose clock is an hour fast calls now
    behind = real - SKEW
    plus_five = timezone(timedelta(hours=5))
    with db.connect(autocommit=False) as conn, conn.transaction():
        outbox.add(conn, Note(text="ahead"), destination="notes", deliver_after=ahead)
        # "in two minutes" by a slow clock: already past for the database
        behind_due = behind + timedelta(minutes=2)
        outbox.add(conn, Note(text="behind"), destination="notes", deliver_after=behind_due)
        in_tokyo = (real + timedelta(seconds=2)).astimezone(plus_five)
        outbox.add(conn, Note(text="elsewhere"), destination="notes", deliver_after=in_tokyo)
        outbox.add(conn, Note(text="delay"), destination="notes", deliver_after=timedelta(hours=2))
        started = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        with pytest.raises(ConfigurationError, match="no time zone"):
            outbox.add(conn, Note(text="naive"), destination="notes", deliver_after=datetime.now())
    # Stored as the instants given (no shift by a time zone), the delay from the database.
    assert (_due(db, "ahead"), _due(db, "behind")) == (ahead, behind_due)
    assert _due(db, "elsewhere") == in_tokyo
    assert _due(db, "delay") == started + timedelta(hours=2)
    assert _due(db, "naive") is None
    released: dict[str, datetime] = {}  # text -> the database's clock after its drain

    def drained_until_elsewhere_went() -> bool:
        relay.drain()
        after = _db_now(db)
        for text in {"behind", "elsewhere"} - _waiting(db) - set(released):
            released[text] = after
        return "elsewhere" in released

    with Relay(db.url, rabbit.config, RelayOptions(), rabbit.topology) as relay:
        relay.drain()
        assert "behind" not in _waiting(db)  # its instant has passed: released at once
        wait_until(drained_until_elsewhere_went, what="the one two seconds ahead, once due")
        assert relay.drain() == 0
    assert released["elsewhere"] >= in_tokyo  # not before its instant, on the database's clock
    assert _waiting(db) == {"ahead", "delay"}  # an hour and two hours away
    texts = [json.loads(m.body)["payload"]["text"] for m in rabbit.receive("notes", 2)]
    assert texts == ["behind", "elsewhere"]
