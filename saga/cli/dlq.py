"""``saga dlq``: list, show, replay and purge dead letters."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from saga.cli.durations import parse_duration
from saga.cli.options import DatabaseUrlOption, JsonOption, SchemaOption
from saga.cli.output import console, iso, print_table
from saga.cli.runtime import connect, settings_from
from saga.cli.text import BLOCK_LIMIT, foreign, foreign_json
from saga.engine.store import SagaStore
from saga.errors import DeadLetterNotFound, NotReplayable
from saga.messaging.dead_letters import DeadLetterFilter, DeadLetterRow, DeadLetterStore
from saga.messaging.envelope import Envelope
from saga.observability.redaction import mask
from saga.operations.replay import outgoing_for, purge, replay, superseded
from saga.settings import Settings

app = typer.Typer(help="Dead letters: list, show, replay, purge.", no_args_is_help=True)

#: ``saga dlq list`` shows this much of each error (``saga dlq show`` shows it whole).
ERROR_COLUMN_LIMIT = 80

ConsumerOption = Annotated[str | None, typer.Option(help="Only this consumer (service).")]
ErrorTypeOption = Annotated[
    str | None, typer.Option("--error-type", help="Only this error type, e.g. TimeoutError.")
]
SinceOption = Annotated[str | None, typer.Option(help="Failed within this long: 30m, 1h, 2d.")]
HomeDatabaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--home-database-url",
        help="The database of the sagas' home service: show each letter's saga status. "
        "Env: SAGA_HOME_DATABASE_URL.",
        envvar="SAGA_HOME_DATABASE_URL",
        show_default=False,
    ),
]


class LetterContext:
    """What an operator should know beside each letter: is its step superseded, and (given
    the sagas' home database) where its saga stands."""

    def __init__(self, superseded: dict[int, str], sagas: dict[Any, tuple[str, str | None]]):
        self.superseded = superseded
        self.sagas = sagas

    @classmethod
    def load(
        cls, conn: Any, letters: list[DeadLetterRow], settings: Settings, home_url: str | None
    ) -> LetterContext:
        moved_on = superseded(conn, letters, schema=settings.db_schema)
        sagas: dict[Any, tuple[str, str | None]] = {}
        ids = sorted({letter.saga_id for letter in letters if letter.saga_id})
        if home_url and ids:
            home = settings.model_copy(update={"database_url": home_url})
            with connect(home) as home_conn:
                sagas = SagaStore(settings.db_schema).statuses(home_conn, ids)
        return cls(moved_on, sagas)

    def saga(self, letter: DeadLetterRow) -> str | None:
        found = self.sagas.get(letter.saga_id)
        if found is None:
            return None
        status, step = found
        return f"{status} at {step}" if step else status

    def describe(self, letter: DeadLetterRow) -> dict[str, Any]:
        return {"superseded": self.superseded.get(letter.id), "saga_status": self.saga(letter)}

    def note(self, letter: DeadLetterRow) -> Text:
        parts = [Text("superseded", style="yellow")] if letter.id in self.superseded else []
        if (saga := self.saga(letter)) is not None:
            parts.append(Text("saga ") + foreign(saga))
        return Text(", ").join(parts)


def _summary(letter: DeadLetterRow) -> dict[str, Any]:
    return {
        "id": letter.id,
        "consumer": letter.consumer,
        "reason": letter.reason,
        "error_type": letter.error_type,
        "error_message": letter.error_message,
        "message_type": letter.message_type,
        "message_id": str(letter.message_id) if letter.message_id else None,
        "saga_id": str(letter.saga_id) if letter.saga_id else None,
        "destination": letter.destination,
        "attempts": letter.attempts,
        "first_failed_at": iso(letter.first_failed_at),
        "last_failed_at": iso(letter.last_failed_at),
        "status": letter.status,
        "replay_count": letter.replay_count,
        "last_replayed_at": iso(letter.last_replayed_at),
    }


def _parse_before(text: str) -> datetime:
    duration = None
    if text and text[-1] in "smhdw" and text[:-1].replace(".", "", 1).isdigit():
        duration = parse_duration(text)
    if duration is not None:
        return datetime.now(UTC) - duration
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is neither a date (2026-11-01, 2026-11-01T12:00) nor a duration (7d)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@app.command("list")
def list_letters(
    consumer: ConsumerOption = None,
    error_type: ErrorTypeOption = None,
    reason: Annotated[str | None, typer.Option(help="rejected, failed or unpublishable.")] = None,
    status: Annotated[
        str, typer.Option(help="pending (default), replayed, purged or all.")
    ] = "pending",
    since: SinceOption = None,
    older_than: Annotated[str | None, typer.Option(help="Failed before this long ago.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 100,
    as_json: JsonOption = False,
    home_database_url: HomeDatabaseUrlOption = None,
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """List dead letters (oldest first), marking those whose saga step was compensated since."""
    settings = settings_from(database_url=database_url, schema=schema)
    where = DeadLetterFilter(
        consumer=consumer,
        error_type=error_type,
        reason=reason,
        status=None if status == "all" else status,
        since=parse_duration(since),
        before=_parse_before(older_than) if older_than else None,
        limit=limit,
    )
    with connect(settings) as conn:
        letters = DeadLetterStore(settings.db_schema).find(conn, where)
        context = LetterContext.load(conn, letters, settings, home_database_url)
    if as_json:
        rows = [{**_summary(letter), **context.describe(letter)} for letter in letters]
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{len(letters)} dead letter(s)")
    for column in ("id", "consumer", "reason", "error", "message", "tries", "last failure"):
        table.add_column(column, overflow="fold")
    table.add_column("saga", overflow="fold")
    for letter in letters:
        table.add_row(
            str(letter.id),
            foreign(letter.consumer),
            foreign(letter.reason),
            foreign(f"{letter.error_type}: {letter.error_message}", limit=ERROR_COLUMN_LIMIT),
            foreign(letter.message_type),
            str(letter.attempts),
            letter.last_failed_at.strftime("%Y-%m-%d %H:%M:%S"),
            context.note(letter),
        )
    print_table(table)


@app.command("show")
def show_letter(
    letter_id: Annotated[int, typer.Argument(help="The dead letter's id.")],
    reveal: Annotated[
        bool, typer.Option(help="Show fields that look like secrets or personal data.")
    ] = False,
    as_json: JsonOption = False,
    home_database_url: HomeDatabaseUrlOption = None,
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """Show one dead letter: error, traceback, headers and payload (sensitive fields masked)."""
    settings = settings_from(database_url=database_url, schema=schema)
    with connect(settings) as conn:
        letter = DeadLetterStore(settings.db_schema).get(conn, letter_id)
        if letter is None:
            raise DeadLetterNotFound(f"no dead letter {letter_id}")
        context = LetterContext.load(conn, [letter], settings, home_database_url)
    document = {**_summary(letter), **context.describe(letter)}
    document["traceback"] = letter.traceback
    try:
        envelope = Envelope.from_bytes(letter.body)
    except ValidationError:
        text = letter.body[:2000].decode("utf-8", errors="replace")
        document["body"] = text if reveal else f"<{len(letter.body)} bytes, not an envelope>"
    else:
        document["headers"] = envelope.headers
        document["payload"] = envelope.payload if reveal else mask(envelope.payload)
    if as_json:
        print(json.dumps(document, indent=2, default=str))
        return
    for key in ("id", "consumer", "reason", "error_type", "error_message", "message_type",
                "message_id", "saga_id", "destination", "attempts", "first_failed_at",
                "last_failed_at", "status", "replay_count", "superseded",
                "saga_status"):  # fmt: skip
        if document[key] is not None or key not in ("superseded", "saga_status"):
            console.print(
                Text.assemble((key, "bold"), ": ", foreign(document[key])), soft_wrap=True
            )
    for key in ("headers", "payload", "body"):
        if key in document:
            console.print(Text(key, style="bold") + ":")
            console.print(foreign_json(document[key]), soft_wrap=True)
    if letter.traceback:
        console.print(Text("traceback", style="bold") + ":")
        console.print(foreign(letter.traceback, limit=BLOCK_LIMIT, multiline=True), soft_wrap=True)
    if not reveal:
        console.print("[dim]fields that look like secrets or personal data are masked; --reveal")


@app.command("replay")
def replay_letters(
    letter_ids: Annotated[list[int] | None, typer.Argument(help="Dead letter ids.")] = None,
    consumer: ConsumerOption = None,
    error_type: ErrorTypeOption = None,
    since: SinceOption = None,
    dry_run: Annotated[
        bool, typer.Option(help="List what would be replayed; change nothing.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            help="Replay superseded letters too (their saga compensated the step since; "
            "the participant will refuse them)."
        ),
    ] = False,
    home_database_url: HomeDatabaseUrlOption = None,
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """Send dead letters again through the outbox, keeping their message ids.

    By id (any status but purged), or every pending letter matching the filters.
    Letters whose saga step was compensated since are skipped unless --force.
    """
    if not letter_ids and not (consumer or error_type or since):
        raise typer.BadParameter(
            "give dead letter ids, or filters (--error-type, --consumer, --since)"
        )
    settings = settings_from(database_url=database_url, schema=schema)
    where = DeadLetterFilter(
        ids=letter_ids or None,
        consumer=consumer,
        error_type=error_type,
        since=parse_duration(since),
        status=None if letter_ids else "pending",
    )
    store = DeadLetterStore(settings.db_schema)
    with connect(settings) as conn:
        letters = store.find(conn, where)
        conn.rollback()
        if letter_ids:
            missing = sorted(set(letter_ids) - {letter.id for letter in letters})
            if missing:
                raise DeadLetterNotFound(f"no dead letters with ids {missing}")
        if dry_run:
            context = LetterContext.load(conn, letters, settings, home_database_url)
            _print_plan(letters, context, force)
            return
        if not letters:
            console.print("nothing to replay")
            return
        with Progress(
            TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), console=console,
            disable=len(letters) < 20,
        ) as progress:  # fmt: skip
            task = progress.add_task("replay", total=len(letters))
            result = replay(
                conn,
                letters,
                {**where.describe(), "command": "saga dlq replay"},
                schema=settings.db_schema,
                force=force,
                on_progress=lambda n: progress.advance(task, n),
            )
    console.print(f"[green]replayed {len(result.replayed)} dead letter(s)[/green]")
    for letter_id, why in result.refused.items():
        console.print(
            Text(f"not replayed {letter_id}: ", style="yellow") + foreign(why), soft_wrap=True
        )
    if result.refused and not result.replayed:
        raise typer.Exit(1)


def _print_plan(letters: list[DeadLetterRow], context: LetterContext, force: bool) -> None:
    skipped = {} if force else context.superseded
    table = Table(
        title=f"dry run: {len(letters) - len(skipped)} of {len(letters)} dead letter(s) "
        "would be replayed; nothing changed"
    )
    for column in ("id", "consumer", "error", "message", "to", "saga"):
        table.add_column(column, overflow="fold")
    for letter in letters:
        try:
            destination = foreign(outgoing_for(letter).destination)
            if letter.id in skipped:
                destination = foreign(f"skipped, {skipped[letter.id]}", style="yellow")
        except NotReplayable as exc:
            destination = foreign(f"refused: {exc}", style="yellow")
        table.add_row(
            str(letter.id),
            foreign(letter.consumer),
            foreign(letter.error_type),
            foreign(f"{letter.message_type} {letter.message_id}"),
            destination,
            context.note(letter),
        )
    print_table(table)


@app.command("purge")
def purge_letters(
    letter_ids: Annotated[list[int] | None, typer.Argument(help="Dead letter ids.")] = None,
    before: Annotated[
        str | None, typer.Option(help="Purge letters that last failed before: a date or 7d.")
    ] = None,
    consumer: ConsumerOption = None,
    error_type: ErrorTypeOption = None,
    dry_run: Annotated[
        bool, typer.Option(help="Count what would be purged; change nothing.")
    ] = False,
    database_url: DatabaseUrlOption = None,
    schema: SchemaOption = None,
) -> None:
    """Mark pending dead letters purged (``saga db prune`` deletes them after retention).

    By id, or every pending letter matching the filters (--before is required then).
    A saga waiting on a purged request is told: a saga held at that step compensates.
    """
    if not letter_ids and not before:
        raise typer.BadParameter("give dead letter ids, or --before (with optional filters)")
    settings = settings_from(database_url=database_url, schema=schema)
    where = DeadLetterFilter(
        ids=letter_ids or None,
        consumer=consumer,
        error_type=error_type,
        before=_parse_before(before) if before else None,
        status="pending",
    )
    with connect(settings) as conn:
        letters = DeadLetterStore(settings.db_schema).find(conn, where)
        conn.rollback()
        if letter_ids:
            missing = sorted(set(letter_ids) - {letter.id for letter in letters})
            if missing:
                raise DeadLetterNotFound(f"no pending dead letters with ids {missing}")
        if dry_run:
            console.print(
                f"dry run: {len(letters)} dead letter(s) would be purged; nothing changed"
            )
            return
        purged = purge(conn, letters, schema=settings.db_schema)
    console.print(f"purged {purged} dead letter(s)")
