"""Every command that prints stored text, over hostile strings stored in PostgreSQL.

Hypothesis writes markup, escape sequences, controls, bidi overrides and long or odd
unicode into saga rows, step logs, dead letters, subscriptions and definitions, then runs
the real ``saga`` command (Typer's runner, in process) over them. Each command must end
with status 0 and no traceback, write nothing that acts on the terminal (no raw ESC, no
other control but newlines), and show each value as written, escaped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

from click.testing import Result
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb
from typer.testing import CliRunner

from saga.cli.app import app
from saga.cli.dlq import ERROR_COLUMN_LIMIT
from saga.cli.text import BLOCK_LIMIT, CELL_LIMIT
from saga.messaging.envelope import Envelope
from saga.observability.visible_text import visible
from tests.support.databases import TestDatabase
from tests.support.hostile import acting_characters, hostile_text
from tests.support.services import Ping

# Each example runs about ten commands against PostgreSQL: a few dozen examples in all
# keep the suite to seconds.
EXAMPLES = settings(
    max_examples=10,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

TABLES = (
    "saga_instances", "saga_steps", "dead_letters", "subscriptions", "saga_definitions",
    "events_unrouted",
)  # fmt: skip


def _clear(db: TestDatabase) -> None:
    db.execute(f"TRUNCATE {', '.join(f'saga.{t}' for t in TABLES)}")


def saga_cli_in_process(db: TestDatabase, *args: str) -> str:
    """``saga *args`` through the real command; its output, checked to be safe to print."""
    result: Result = CliRunner().invoke(
        app, list(args), env={"SAGA_DATABASE_URL": db.url, "COLUMNS": "200"}
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args,
        result.exception,
    )
    assert result.exit_code == 0, (args, result.output)
    assert "Traceback (most recent call last)" not in result.output, result.output
    acting = acting_characters(result.output)
    assert not acting, (args, acting)
    return result.output


def shown(value: str, limit: int = CELL_LIMIT, multiline: bool = False) -> str:
    """How a value must appear in a command's output: escaped, cut, trimmed at its ends
    (a table cell pads and strips)."""
    return visible(value, limit=limit, multiline=multiline).strip()


@dataclass(frozen=True)
class StoredSaga:
    id: UUID
    name: str
    step: str
    error: str
    key: str
    data: dict[str, str]


def _store_saga(db: TestDatabase, name: str, step: str, error: str, key: str) -> StoredSaga:
    saga = StoredSaga(uuid4(), name, step, error, key, {key: error, "step": step})
    db.execute(
        "INSERT INTO saga.saga_instances (id, name, saga_version, service, status, step, data,"
        " last_error, idempotency_key, started_at, updated_at)"
        " VALUES (%s, %s, 1, %s, 'running', %s, %s, %s, %s,"
        " now() - interval '2 hours', now() - interval '1 hour')",
        (saga.id, name, name, step, Jsonb(saga.data), error, key),
    )
    db.execute(
        "INSERT INTO saga.saga_steps (saga_id, step, phase, outcome, started_at, finished_at,"
        " error) VALUES (%s, %s, 'forward', 'failed', now() - interval '1 hour', now(), %s)",
        (saga.id, step, error),
    )
    db.execute(
        "INSERT INTO saga.saga_definitions (name, version, fingerprint, steps)"
        " VALUES (%s, 1, %s, '[]')",
        (name, step),
    )
    db.execute("INSERT INTO saga.events_unrouted (message_type, events) VALUES (%s, 1)", (step,))
    return saga


@given(name=hostile_text(), step=hostile_text(), error=hostile_text(), key=hostile_text())
@EXAMPLES
def test_saga_commands_show_hostile_names_steps_errors_keys_and_data_as_written(
    db: TestDatabase, name: str, step: str, error: str, key: str
) -> None:
    _clear(db)
    saga = _store_saga(db, name, step, error, key)

    listed = saga_cli_in_process(db, "list", "--key", key)
    for value in (f"{name} v1", step, error):
        assert shown(value) in listed
    assert "1 saga(s)" in listed

    one = saga_cli_in_process(db, "show", str(saga.id))
    for value in (name, step, error):
        assert shown(value) in one
    document = json.loads(saga_cli_in_process(db, "show", str(saga.id), "--json"))
    assert (document["name"], document["step"], document["data"]) == (name, step, saga.data)
    assert document["timeline"][0]["error"] == error

    figures = saga_cli_in_process(db, "stats", "--stuck-after", "30m")
    assert shown(name) in figures  # the counts' row
    assert shown(f"  {saga.id}  {name}  running at {step}") in figures  # the stuck saga
    assert shown(step) in figures  # the unrouted event's type

    stuck = saga_cli_in_process(db, "resume", "--dry-run", "--stuck-after", "30m")
    for value in (name, step):
        assert shown(value) in stuck

    in_use = saga_cli_in_process(db, "versions")
    for value in (name, step):  # the name, and the definition's fingerprint
        assert shown(value) in in_use


@st.composite
def _letters(draw: st.DrawFn) -> dict[str, Any]:
    fields = ("consumer", "type", "error_type", "error", "traceback", "header", "note")
    letter: dict[str, Any] = {field: draw(hostile_text()) for field in fields}
    letter["envelope"] = draw(st.booleans())  # else the body is the note's bytes, no envelope
    return letter


@given(letter=_letters())
@EXAMPLES
def test_dead_letter_commands_show_hostile_types_errors_tracebacks_headers_and_bodies_as_written(
    db: TestDatabase, letter: dict[str, Any]
) -> None:
    _clear(db)
    envelope = Envelope.wrap(Ping(key="k")).model_copy(
        update={
            "type": letter["type"],
            "headers": {letter["header"]: letter["note"]},
            "payload": {"note": letter["note"]},
        }
    )
    body = envelope.to_bytes() if letter["envelope"] else letter["note"].encode()
    traceback = f'  File "handler.py", line 7, in handle\n{letter["traceback"]}\nValueError: x'
    letter_id = db.scalar(
        "INSERT INTO saga.dead_letters (consumer, reason, message_id, message_type, destination,"
        " content_type, body, error_type, error_message, traceback)"
        " VALUES (%s, 'failed', %s, %s, %s, 'application/json', %s, %s, %s, %s) RETURNING id",
        (
            letter["consumer"], envelope.message_id, letter["type"], letter["consumer"],
            body, letter["error_type"], letter["error"], traceback,
        ),
    )  # fmt: skip

    listed = saga_cli_in_process(db, "dlq", "list", "--error-type", letter["error_type"])
    assert "1 dead letter(s)" in listed
    assert shown(letter["consumer"]) in listed
    assert shown(letter["type"]) in listed
    assert shown(f"{letter['error_type']}: {letter['error']}", ERROR_COLUMN_LIMIT) in listed

    one = saga_cli_in_process(db, "dlq", "show", str(letter_id), "--reveal")
    for key in ("consumer", "error_type", "error_message", "message_type"):
        value = letter[{"error_message": "error", "message_type": "type"}.get(key, key)]
        assert f"{key}: {visible(value, limit=CELL_LIMIT)}".strip() in one
    assert shown(traceback, limit=BLOCK_LIMIT, multiline=True) in one
    # Headers and payload, or the first 2,000 bytes of a body that is no envelope: as JSON.
    strings = [letter["header"], letter["note"]] if letter["envelope"] else [
        body[:2000].decode("utf-8", errors="replace")
    ]  # fmt: skip
    for value in strings:
        assert visible(json.dumps(value, ensure_ascii=False), limit=BLOCK_LIMIT) in one

    plan = saga_cli_in_process(db, "dlq", "replay", str(letter_id), "--dry-run")
    assert "nothing changed" in plan
    assert shown(letter["consumer"]) in plan


@given(consumer=hostile_text(), event=hostile_text(), broker=hostile_text(), queue=hostile_text())
@EXAMPLES
def test_subscriptions_show_hostile_service_event_broker_and_queue_names_as_written(
    db: TestDatabase, consumer: str, event: str, broker: str, queue: str
) -> None:
    _clear(db)
    db.execute(
        "INSERT INTO saga.subscriptions (consumer, message_type, broker, queue)"
        " VALUES (%s, %s, %s, %s)",
        (consumer, event, broker, queue),
    )
    listed = saga_cli_in_process(db, "subscriptions")
    for value in (consumer, event, broker, queue):
        assert shown(value) in listed
