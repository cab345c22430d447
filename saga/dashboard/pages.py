"""What each read-only page shows, gathered from the services' databases through the
operations layer (the same queries as ``saga list``, ``saga show``, ``saga stats`` and
``saga dlq``), with sensitive fields masked as the CLI masks them."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from pydantic import ValidationError

from saga.broker.queue_depths import QueueDepth
from saga.broker.transport import BrokerConfig, Topology
from saga.dashboard import timeline
from saga.dashboard.databases import Databases
from saga.db.connections import DIRECT, DatabaseAccess
from saga.db.sql import Tx
from saga.db.vacuum_horizon import VacuumHorizon, read_vacuum_horizon
from saga.engine.state import SagaRecord, SagaStatus, SagaSummary
from saga.engine.store import SagaFilter, SagaStore
from saga.errors import DatabaseUnavailable, DeadLetterNotFound, NotReplayable, UnknownSaga
from saga.messaging.dead_letters import DeadLetterFilter, DeadLetterGroup, DeadLetterStore
from saga.messaging.envelope import Envelope
from saga.observability.redaction import mask, password_of, redact_text
from saga.operations.branches import branches
from saga.operations.replay import outgoing_for, superseded
from saga.operations.saga_messages import SagaMessages, received_at, saga_messages
from saga.operations.stats import (
    SagaWaiting,
    collect,
    longest_waiting,
    oldest_running,
    per_minute,
)

PAGE_SIZE = 50
#: The overview's lists of oldest running and longest waiting sagas.
LIST_LIMIT = 10


def masked_json(value: Any) -> str:
    return json.dumps(mask(value), indent=2, default=str)


@dataclass
class ServiceOverview:
    service: str
    error: str | None = None
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    minutes: list[tuple[datetime, int, int]] = field(default_factory=list)
    oldest: list[SagaWaiting] = field(default_factory=list)
    waiting: list[SagaWaiting] = field(default_factory=list)
    letters: list[DeadLetterGroup] = field(default_factory=list)
    vacuum: VacuumHorizon | None = None

    @property
    def pending_letters(self) -> int:
        return sum(group.letters for group in self.letters)


def _per_service(
    databases: Databases, fill: Callable[[ServiceOverview, psycopg.Connection[Any], str], None]
) -> list[ServiceOverview]:
    """A view per service, filled by ``fill``; a database that fails says so in its view."""
    found = []
    for service in databases.services:
        view = ServiceOverview(service)
        try:
            with databases.connect(service) as conn:
                fill(view, conn, databases.database(service).schema)
        except (DatabaseUnavailable, psycopg.Error) as exc:
            view.error = str(exc)
        found.append(view)
    return found


def _letter_groups(view: ServiceOverview, tx: Tx, schema: str) -> None:
    view.letters = DeadLetterStore(schema).groups(tx)


def _figures(view: ServiceOverview, tx: Tx, schema: str) -> None:
    figures = collect(tx, schema, window=timedelta(hours=1), stuck_after=timedelta(minutes=15))
    view.counts = figures.counts
    view.minutes = per_minute(tx, schema)
    view.oldest = oldest_running(tx, schema, LIST_LIMIT)
    view.waiting = longest_waiting(tx, schema, LIST_LIMIT)
    _letter_groups(view, tx, schema)
    view.vacuum = read_vacuum_horizon(tx, [schema])


def overview(databases: Databases) -> list[ServiceOverview]:
    """Per service: sagas by name and status, starts and ends per minute over the last
    hour, the oldest running and longest waiting sagas, pending dead letters."""
    return _per_service(databases, _figures)


def letter_groups(databases: Databases) -> list[ServiceOverview]:
    """Per service: pending dead letters by consumer, reason and error type."""
    return _per_service(databases, _letter_groups)


def activity_chart(views: list[ServiceOverview]) -> dict[str, Any]:
    """Sagas started and finished per minute, summed over the services (Chart.js data)."""
    started: dict[datetime, int] = {}
    finished: dict[datetime, int] = {}
    for view in views:
        for minute, begun, ended in view.minutes:
            started[minute] = started.get(minute, 0) + begun
            finished[minute] = finished.get(minute, 0) + ended
    minutes = sorted(started)
    return {
        "labels": [m.astimezone(UTC).strftime("%H:%M") for m in minutes],
        "started": [started[m] for m in minutes],
        "finished": [finished[m] for m in minutes],
    }


@dataclass(frozen=True, slots=True)
class Queues:
    """What the broker tells of the services' queues: everything a PostgreSQL broker
    knows (``detailed``), or the messages waiting in each queue of RabbitMQ or Redis."""

    detailed: dict[str, QueueDepth] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)


def queues(
    broker: BrokerConfig | None,
    topology: Topology,
    services: list[str],
    access: DatabaseAccess = DIRECT,
) -> Queues | None:
    """The broker's queues, or None when no broker is given."""
    if broker is None:
        return None
    try:
        depths = broker.queue_depths(topology, services, access)
        if broker.capabilities.queue_details:
            return Queues(detailed=depths)
        named = {service: topology.queue_name(service) for service in services}
        return Queues(waiting={s: depths[q].ready for s, q in named.items() if q in depths})
    except Exception as exc:  # any broker or driver error: shown on the page, redacted
        text = redact_text(str(exc), password_of(broker.url))
        raise DatabaseUnavailable(f"the broker did not answer: {text}") from None


@dataclass(frozen=True, slots=True)
class SagaPage:
    rows: list[SagaSummary]
    next_after: str | None


def encode_after(row: SagaSummary) -> str:
    return f"{row.started_at.isoformat()}_{row.id}"


def decode_after(text: str) -> tuple[datetime, UUID]:
    moment, _, saga_id = text.rpartition("_")
    try:
        return datetime.fromisoformat(moment), UUID(saga_id)
    except ValueError:
        raise ValueError(f"bad page cursor {text!r}") from None


def saga_page(databases: Databases, service: str, where: SagaFilter) -> SagaPage:
    """One page of sagas, newest first, and the cursor of the next page (if any)."""
    schema = databases.database(service).schema
    one_more = replace(where, limit=where.limit + 1)
    with databases.connect(service) as conn:
        rows = SagaStore(schema).list(conn, one_more)
    more = len(rows) > where.limit
    rows = rows[: where.limit]
    return SagaPage(rows, encode_after(rows[-1]) if more else None)


@dataclass
class SagaDetail:
    service: str
    record: SagaRecord
    steps: list[timeline.TimelineRow]
    commands: list[timeline.SentCommand]
    data_json: str
    chart: dict[str, Any]
    messages: dict[str, SagaMessages]
    received: dict[UUID, datetime]
    unreachable: dict[str, str]

    @property
    def pending(self) -> int:
        """Messages of the saga still waiting in an outbox, in every database."""
        return sum(len(found.pending) for found in self.messages.values())


def saga_detail(databases: Databases, service: str, saga_id: UUID) -> SagaDetail:
    """A saga, its timeline as bars, its masked data, and its messages in every database."""
    schema = databases.database(service).schema
    store = SagaStore(schema)
    with databases.connect(service) as conn:
        record = store.load(conn, saga_id)
        if record is None:
            raise UnknownSaga(f"no saga {saga_id} in {service}'s database")
        entries = store.timeline(conn, saga_id)
        branch_of = branches(conn, schema, record.name, record.saga_version)
    origin = record.started_at or datetime.now(UTC)  # always set once stored
    messages: dict[str, SagaMessages] = {}
    unreachable: dict[str, str] = {}
    for other in databases.services:
        try:
            with databases.connect(other) as conn:
                messages[other] = saga_messages(conn, databases.database(other).schema, saga_id)
        except (DatabaseUnavailable, psycopg.Error) as exc:
            unreachable[other] = str(exc)
    reply_ids = [r.reply_id for found in messages.values() for r in found.replies]
    with databases.connect(service) as conn:
        received = received_at(conn, schema, record.service, reply_ids)
    letters = [letter for found in messages.values() for letter in found.dead_letters]
    steps = timeline.step_rows(entries, letters, origin, branch_of)
    wait = timeline.current_wait(record, steps, origin, datetime.now(UTC))
    return SagaDetail(
        service,
        record,
        steps,
        timeline.commands_sent(steps),
        masked_json(record.data),
        timeline.chart([*steps, wait] if wait else steps),
        messages,
        received,
        unreachable,
    )


@dataclass
class LetterDetail:
    service: str
    letter: Any
    payload_json: str | None
    headers_json: str | None
    superseded: str | None


def letter_detail(databases: Databases, service: str, letter_id: int) -> LetterDetail:
    """One dead letter, its payload masked (a body that is no envelope is not shown)."""
    schema = databases.database(service).schema
    with databases.connect(service) as conn:
        letter = DeadLetterStore(schema).get(conn, letter_id)
        if letter is None:
            raise DeadLetterNotFound(f"no dead letter {letter_id} in {service}'s database")
        moved_on = superseded(conn, [letter], schema=schema)
    try:
        envelope = Envelope.from_bytes(letter.body)
    except ValidationError:
        payload = headers = None
    else:
        payload = masked_json(envelope.payload)
        headers = json.dumps(envelope.headers, indent=2)
    return LetterDetail(service, letter, payload, headers, moved_on.get(letter.id))


@dataclass(frozen=True, slots=True)
class PlannedReplay:
    letter: Any
    destination: str | None
    skipped: str | None
    #: Why the replay would likely fail again (a letter rejected before any handler ran).
    warning: str | None = None


def _rejected_again(letter: Any) -> str | None:
    if letter.reason != "rejected":
        return None
    return (
        f"rejected before any handler ran ({letter.error_type}): replayed unchanged, it is "
        f"rejected again unless {letter.consumer} has changed to accept it"
    )


def replay_plan(databases: Databases, service: str, where: DeadLetterFilter) -> list[PlannedReplay]:
    """What replaying the letters ``where`` selects would send (the dry run): each
    letter's destination, or why it would be skipped."""
    schema = databases.database(service).schema
    with databases.connect(service) as conn:
        letters = DeadLetterStore(schema).find(conn, where)
        moved_on = superseded(conn, letters, schema=schema)
    plan = []
    for letter in letters:
        try:
            destination: str | None = outgoing_for(letter).destination
            skipped = moved_on.get(letter.id)
        except NotReplayable as exc:
            destination, skipped = None, f"refused: {exc}"
        plan.append(PlannedReplay(letter, destination, skipped, _rejected_again(letter)))
    return plan


STATUSES = [status.value for status in SagaStatus]
