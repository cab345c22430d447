"""The orchestrator's SQL: saga instances and their step log."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from saga.db.sql import AsyncTx, Tx, render
from saga.engine.state import SagaRecord, SagaStatus, SagaSummary, StepLogEntry
from saga.errors import ConcurrentUpdate
from saga.messaging.outbox import EmbeddedInsert

_COLUMNS = """id, name, saga_version, service, status, step, data, completed_steps,
    pending_message_id, step_attempt, cancel_requested, pivot_reached, last_error, idempotency_key,
    version, started_at, updated_at, step_started_at, finished_at, failed_step, step_state"""

#: A new saga, written as its first transition left it (one statement per start).
_INSERT = """
INSERT INTO {schema}.saga_instances
    (id, name, saga_version, service, idempotency_key, idempotency_fingerprint, status, step,
     data, completed_steps, pending_message_id, step_attempt, cancel_requested, pivot_reached,
     last_error, step_started_at, failed_step, step_state, finished_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
        CASE WHEN %s THEN now() END)
ON CONFLICT (name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
"""

_BY_KEY = """
SELECT id, idempotency_fingerprint FROM {schema}.saga_instances
WHERE name = %s AND idempotency_key = %s
"""

_LOAD = "SELECT " + _COLUMNS + " FROM {schema}.saga_instances WHERE id = %s"

_UPDATE = """
UPDATE {schema}.saga_instances SET
    status = %s, step = %s, data = %s, completed_steps = %s, pending_message_id = %s,
    step_attempt = %s, cancel_requested = %s, pivot_reached = %s, last_error = %s,
    step_started_at = %s, failed_step = %s, step_state = %s,
    finished_at = CASE WHEN %s THEN coalesce(finished_at, now()) ELSE NULL END,
    updated_at = now(), version = version + 1
WHERE id = %s AND version = %s
RETURNING id
"""

_LOAD_MANY = "SELECT " + _COLUMNS + " FROM {schema}.saga_instances WHERE id = ANY(%b::uuid[])"

#: The same rows as documents (one jsonb column), for a statement of the caller's to read
#: beside its own work: a delivery's opening statement (:meth:`SagaStore.documents_read`).
_DOCUMENTS = "SELECT to_jsonb(s) FROM {schema}.saga_instances AS s WHERE s.id = ANY(%b::uuid[])"

#: The columns of a row's document that are not JSON types, and how to read them back.
_UUID_FIELDS = ("id", "pending_message_id")
_INSTANT_FIELDS = ("started_at", "updated_at", "step_started_at", "finished_at")

#: Every saga a batch changed, in one statement: the rows travel as one JSON array. The
#: ids again as an array, so that the sagas are found by their key: the planner guesses
#: 100 rows for any jsonb_to_recordset and, without ``id = ANY(...)``, hash-joined them
#: with a scan of the whole table (1.3 ms at 6,000 sagas, growing with the table).
_UPDATE_MANY = """
UPDATE {schema}.saga_instances AS s SET
    status = v.status, step = v.step, data = v.data, completed_steps = v.completed_steps,
    pending_message_id = v.pending_message_id, step_attempt = v.step_attempt,
    cancel_requested = v.cancel_requested, pivot_reached = v.pivot_reached,
    last_error = v.last_error, step_started_at = v.step_started_at,
    failed_step = v.failed_step, step_state = v.step_state,
    finished_at = CASE WHEN v.ended THEN coalesce(s.finished_at, now()) ELSE NULL END,
    updated_at = now(), version = s.version + 1
FROM jsonb_to_recordset(%s) AS v(
    id uuid, version bigint, status text, step text, data jsonb, completed_steps text[],
    pending_message_id uuid, step_attempt int, cancel_requested boolean, pivot_reached boolean,
    last_error text, step_started_at timestamptz, failed_step text, step_state jsonb,
    ended boolean)
WHERE s.id = ANY(%b::uuid[]) AND s.id = v.id AND s.version = v.version
RETURNING s.id AS id
"""

_LOG_MANY = """
INSERT INTO {schema}.saga_steps
    (saga_id, step, phase, attempt, outcome, started_at, finished_at, error, message_id)
SELECT saga_id, step, phase, attempt, outcome, started_at, finished_at, error, message_id
FROM jsonb_to_recordset(%s) AS v(
    saga_id uuid, step text, phase text, attempt int, outcome text, started_at timestamptz,
    finished_at timestamptz, error text, message_id uuid)
"""

#: What :meth:`SagaStore._write_step` returns: a row with no outbox id for each saga row
#: written (its id second), beside the messages written (their leased columns, or their
#: ids alone).
_SAGA_MARKS = "SELECT NULL::bigint, id, NULL::text, NULL::text, NULL::bytea FROM saga_rows"
_WRITTEN_LEASED = "SELECT id, message_id, destination, message_type, body FROM written"
_WRITTEN_IDS = "SELECT id, NULL::uuid, NULL::text, NULL::text, NULL::bytea FROM written"

#: What a start whose idempotency key was taken wrote beside the saga row it could not.
_FORGET_START = """
WITH unsent AS (DELETE FROM {schema}.outbox WHERE id = ANY(%b::bigint[]))
DELETE FROM {schema}.saga_steps WHERE saga_id = %s
"""

_LOG = """
INSERT INTO {schema}.saga_steps
    (saga_id, step, phase, attempt, outcome, started_at, finished_at, error, message_id)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
"""

_REQUEST_CANCEL = """
UPDATE {schema}.saga_instances
SET cancel_requested = true, last_error = %s, updated_at = now(), version = version + 1
WHERE id = %s AND status = 'running' AND NOT pivot_reached
"""

_UNFINISHED_BY_VERSION = """
SELECT name, saga_version, count(*) FROM {schema}.saga_instances
WHERE name = ANY(%b::text[]) AND finished_at IS NULL GROUP BY 1, 2 ORDER BY 1, 2
"""

_VERSIONS = """
SELECT i.name, i.saga_version,
       count(*) FILTER (WHERE status IN ('running', 'compensating') AND waiting_for IS NULL),
       count(*) FILTER (WHERE waiting_for IS NOT NULL),
       count(*) FILTER (WHERE status IN ('compensation_failed', 'forward_failed')),
       count(*) FILTER (WHERE status IN ('completed', 'compensated')),
       d.fingerprint
FROM {schema}.saga_instances i
LEFT JOIN {schema}.saga_definitions d ON d.name = i.name AND d.version = i.saga_version
GROUP BY 1, 2, d.fingerprint ORDER BY 1, 2
"""

_DEFINITIONS = """
SELECT name, version, steps FROM {schema}.saga_definitions WHERE name = ANY(%b::text[])
"""

_RECORD_DEFINITION = """
INSERT INTO {schema}.saga_definitions (name, version, fingerprint, steps) VALUES (%s, %s, %s, %s)
ON CONFLICT (name, version) DO UPDATE
SET fingerprint = EXCLUDED.fingerprint, steps = EXCLUDED.steps, recorded_at = now()
WHERE saga_definitions.fingerprint <> EXCLUDED.fingerprint
"""

_MIGRATION_PLAN = """
SELECT %(guard)s = ANY(completed_steps), count(*) FROM {schema}.saga_instances
WHERE name = %(name)s AND saga_version = %(from)s AND status = 'running'
GROUP BY 1
"""

_MIGRATE_BATCH = """
WITH batch AS (
    SELECT id FROM {schema}.saga_instances
    WHERE name = %(name)s AND saga_version = %(from)s AND status = 'running'
      AND NOT (%(guard)s = ANY(completed_steps))
    ORDER BY id LIMIT %(limit)s
    FOR UPDATE
)
UPDATE {schema}.saga_instances s
SET saga_version = %(to)s, version = s.version + 1, updated_at = now()
FROM batch WHERE s.id = batch.id
RETURNING s.id, s.step, s.step_attempt
"""

_STATUSES = "SELECT id, status, step FROM {schema}.saga_instances WHERE id = ANY(%b::uuid[])"

_TIMELINE = """
SELECT step, phase, attempt, outcome, started_at, finished_at, error, message_id
FROM {schema}.saga_steps WHERE saga_id = %s ORDER BY id
"""

#: ``saga list``. The filters left out (NULL) fold away when the statement is planned with
#: its values, so a key is found through ``saga_instances_idempotency_key`` and data fields
#: through the GIN index ``saga_instances_data`` (``data @> '{"order_id": "o-17"}'``).
LIST_SAGAS = """
SELECT id, name, saga_version, status, step, last_error, started_at, updated_at, finished_at,
       step_state
FROM {schema}.saga_instances
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(key)s::text IS NULL OR idempotency_key = %(key)s)
  AND (%(data)s::jsonb IS NULL OR data @> %(data)s::jsonb)
  AND (%(older)s::interval IS NULL OR started_at < now() - %(older)s::interval)
  AND (%(newer)s::interval IS NULL OR started_at >= now() - %(newer)s::interval)
  AND (%(from)s::timestamptz IS NULL OR started_at >= %(from)s)
  AND (%(to)s::timestamptz IS NULL OR started_at < %(to)s)
  AND (%(id)s::uuid IS NULL OR id = %(id)s)
  AND (%(text)s::text IS NULL OR data::text LIKE %(text)s)
  AND (%(after_at)s::timestamptz IS NULL OR (started_at, id) < (%(after_at)s, %(after_id)s::uuid))
ORDER BY started_at DESC, id DESC
LIMIT %(limit)s
"""


@dataclass(frozen=True, slots=True)
class SagaFilter:
    """Which sagas a list shows (None means any), newest first.

    ``after`` is the (started_at, id) of the last saga of the previous page: the next
    page starts below it (keyset pagination: as fast on page 1,000 as on page 1).
    ``text`` matches anywhere in the saga's data as JSON text, case and all (LIKE is
    twice as fast as ILIKE here); it reads every saga the other filters leave.
    """

    status: str | None = None
    name: str | None = None
    older_than: timedelta | None = None
    newer_than: timedelta | None = None
    started_from: datetime | None = None
    started_to: datetime | None = None
    saga_id: UUID | None = None
    #: the idempotency key the saga was started with
    key: str | None = None
    #: top-level fields the saga's data holds (``data @>``, through its GIN index)
    data: dict[str, Any] | None = None
    text: str | None = None
    after: tuple[datetime, UUID] | None = None
    limit: int = 50


def list_parameters(where: SagaFilter) -> dict[str, Any]:
    """The parameters of :data:`LIST_SAGAS` for ``where``."""
    after_at, after_id = where.after or (None, None)
    return {
        "status": where.status,
        "name": where.name,
        "older": where.older_than,
        "newer": where.newer_than,
        "from": where.started_from,
        "to": where.started_to,
        "id": where.saga_id,
        "key": where.key,
        "data": Jsonb(where.data) if where.data else None,
        "text": _like(where.text),
        "after_at": after_at,
        "after_id": after_id,
        "limit": where.limit,
    }


def _like(text: str | None) -> str | None:
    """``text`` as a LIKE pattern matching it anywhere, its wildcards taken literally."""
    if not text:
        return None
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class SagaStore:
    """Statements on one schema's saga tables, on the caller's connection."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._insert = render(_INSERT, schema)
        self._insert_returning = self._insert + "RETURNING id\n"
        self._forget_start = render(_FORGET_START, schema)
        self._by_key = render(_BY_KEY, schema)
        self._load = render(_LOAD, schema)
        self._update = render(_UPDATE, schema)
        self._load_many = render(_LOAD_MANY, schema)
        self._documents = render(_DOCUMENTS, schema)
        self._update_many = render(_UPDATE_MANY, schema)
        self._log = render(_LOG, schema)
        self._log_many = render(_LOG_MANY, schema)
        self._timeline = render(_TIMELINE, schema)
        self._statuses = render(_STATUSES, schema)
        self._request_cancel = render(_REQUEST_CANCEL, schema)
        self._unfinished_by_version = render(_UNFINISHED_BY_VERSION, schema)
        self._versions = render(_VERSIONS, schema)
        self._definitions = render(_DEFINITIONS, schema)
        self._record_definition = render(_RECORD_DEFINITION, schema)
        self._migration_plan = render(_MIGRATION_PLAN, schema)
        self._migrate_batch = render(_MIGRATE_BATCH, schema)
        self._list = render(LIST_SAGAS, schema)

    def find_by_key(self, tx: Tx, name: str, key: str) -> tuple[UUID, str | None] | None:
        """The saga started under ``key`` and the fingerprint of the data it started with."""
        row = tx.execute(self._by_key, (name, key)).fetchone()
        if row is None:
            return None
        saga_id, fingerprint = row
        return saga_id, fingerprint

    def load(self, tx: Tx, saga_id: UUID) -> SagaRecord | None:
        cur = tx.cursor(row_factory=dict_row)
        row = cur.execute(self._load, (saga_id,), prepare=True).fetchone()
        return None if row is None else _record(row)

    def load_many(self, tx: Tx, saga_ids: Sequence[UUID]) -> dict[UUID, SagaRecord]:
        """The sagas among ``saga_ids`` that exist, by id, in one statement."""
        cur = tx.cursor(row_factory=dict_row)
        rows = cur.execute(self._load_many, (list(saga_ids),), prepare=True).fetchall()
        return {row["id"]: _record(row) for row in rows}

    def documents_read(self, saga_ids: Sequence[UUID]) -> tuple[str, list[Any]]:
        """A query of one jsonb column, the rows of those of ``saga_ids`` that exist (for
        :func:`records_of_documents`), and its parameters: to run inside a statement of the
        caller's."""
        return self._documents, [list(saga_ids)]

    def update_many_statement(self, records: Sequence[SagaRecord]) -> tuple[str, list[Any]]:
        """The statement (and its parameters) :meth:`save_steps` writes several ``records``
        with."""
        rows = [_row_document(record) for record in records]
        return self._update_many, [Jsonb(rows), [record.id for record in records]]

    def save_steps(
        self,
        tx: Tx,
        records: Sequence[SagaRecord],
        log: Sequence[StepLogEntry],
        messages: EmbeddedInsert | None,
    ) -> list[tuple[Any, ...]]:
        """What transitions of sagas write, in ONE statement: every row of ``records``
        (each only if unchanged since it was read), the ``log`` and the outbox insert
        ``messages``. Returns what ``messages`` returned. Raises :class:`ConcurrentUpdate`
        naming the sagas that changed meanwhile (nothing may then be committed: the
        caller rolls back; the rest was written all the same)."""
        if len(records) == 1:
            (record,) = records
            statement, params = self._update, [*_state_params(record), record.id, record.version]
        elif records:
            statement, params = self.update_many_statement(records)
        else:
            statement, params = None, []
        saved, written = self._write_step(tx, statement, params, log, messages)
        changed = [str(record.id) for record in records if record.id not in saved]
        if changed:
            raise ConcurrentUpdate(f"sagas changed since they were read: {', '.join(changed)}")
        for record in records:
            record.version += 1
        return written

    def insert_step(
        self,
        tx: Tx,
        record: SagaRecord,
        fingerprint: str | None,
        log: Sequence[StepLogEntry],
        messages: EmbeddedInsert | None,
    ) -> list[tuple[Any, ...]] | None:
        """A new saga's row (as its first transition left it, ``fingerprint`` kept with its
        idempotency key), the ``log`` and the outbox insert ``messages`` in ONE statement.
        Returns what ``messages`` returned; None if the saga's idempotency key is taken,
        and then nothing of it is left written (its log and messages are deleted again)."""
        params = list(_insert_params(record, fingerprint))
        inserted, written = self._write_step(tx, self._insert_returning, params, log, messages)
        if inserted:
            return written
        if log or written:
            tx.execute(self._forget_start, ([row[0] for row in written], record.id))
        return None

    def _write_step(
        self,
        tx: Tx,
        saga_statement: str | None,
        saga_params: list[Any],
        log: Sequence[StepLogEntry],
        messages: EmbeddedInsert | None,
    ) -> tuple[set[UUID], list[tuple[Any, ...]]]:
        """Run ``saga_statement`` (an insert or update of saga rows returning the ids of
        those it wrote; None: no saga row), the log and ``messages`` as one statement:
        (the ids of the sagas written, what ``messages`` returned)."""
        ctes, params, selects = [], list(saga_params), []
        if saga_statement is not None:
            ctes.append(f"saga_rows AS ({saga_statement})")
            selects.append(_SAGA_MARKS)
        if log:
            ctes.append(f"logged AS ({self._log_many})")
            params.append(Jsonb([_log_document(entry) for entry in log]))
        if messages is not None:
            ctes.append(f"written AS ({messages.query})")
            params += messages.params
            selects.append(_WRITTEN_LEASED if messages.leased else _WRITTEN_IDS)
        if not ctes:
            return set(), []
        statement = "WITH " + ",\n".join(ctes) + "\n" + ("\nUNION ALL\n".join(selects) or "SELECT")
        returned = tx.execute(statement, params, prepare=True).fetchall()
        saved = {row[1] for row in returned if row and row[0] is None}
        return saved, [row for row in returned if row and row[0] is not None]

    def request_cancel(self, tx: Tx, saga_id: UUID, reason: str) -> bool:
        """Flag a running saga, before its pivot, to compensate when its pending reply arrives."""
        cur = tx.execute(self._request_cancel, _cancel_params(saga_id, reason))
        return cur.rowcount == 1

    def unfinished_by_version(self, tx: Tx, names: list[str]) -> list[tuple[str, int, int]]:
        """(name, version, unfinished sagas) of the sagas called ``names``, in one query."""
        return tx.execute(self._unfinished_by_version, (names,)).fetchall()

    def versions(self, tx: Tx) -> list[tuple[Any, ...]]:
        """(name, version, running, waiting, needing an operator, finished, the recorded
        definition's fingerprint) per version."""
        return tx.execute(self._versions).fetchall()

    def recorded_definitions(
        self, tx: Tx, names: list[str]
    ) -> dict[tuple[str, int], list[dict[str, Any]]]:
        """(name, version) -> the recorded shape of each version of the sagas ``names``."""
        return {(n, v): steps for n, v, steps in tx.execute(self._definitions, (names,))}

    def record_definition(
        self,
        tx: Tx,
        name: str,
        version: int,
        fingerprint: str,
        steps: list[dict[str, Any]],
    ) -> None:
        """Record (or replace) the shape of saga ``name`` at ``version``."""
        tx.execute(self._record_definition, (name, version, fingerprint, Jsonb(steps)))

    def migration_plan(self, tx: Tx, name: str, from_version: int, guard: str) -> tuple[int, int]:
        """(would move, would stay) among running sagas of ``from_version``."""
        rows = dict(
            tx.execute(
                self._migration_plan, {"name": name, "from": from_version, "guard": guard}
            ).fetchall()
        )
        return int(rows.get(False, 0)), int(rows.get(True, 0))

    def migrate_batch(
        self,
        tx: Tx,
        name: str,
        from_version: int,
        to_version: int,
        guard: str,
        limit: int,
    ) -> list[tuple[UUID, str | None, int]]:
        """Move up to ``limit`` sagas that have not passed ``guard``; each row atomically."""
        params = {"name": name, "from": from_version, "to": to_version, "guard": guard}
        return tx.execute(self._migrate_batch, {**params, "limit": limit}).fetchall()

    def log(self, tx: Tx, entries: Sequence[StepLogEntry]) -> None:
        """Append ``entries`` to the step log in one statement."""
        if len(entries) == 1:  # the usual case: a plain prepared insert is cheapest
            e = entries[0]
            params = (e.saga_id, e.step, e.phase.value, e.attempt, e.outcome, e.started_at,
                      e.finished_at, e.error, e.message_id)  # fmt: skip
            tx.execute(self._log, params, prepare=True)
        elif entries:
            tx.execute(self._log_many, (Jsonb([_log_document(e) for e in entries]),))

    def statuses(self, tx: Tx, saga_ids: Sequence[UUID]) -> dict[UUID, tuple[str, str | None]]:
        """(status, step) of each of ``saga_ids`` found here."""
        rows = tx.execute(self._statuses, (list(saga_ids),)).fetchall()
        return {saga_id: (status, step) for saga_id, status, step in rows}

    def timeline(self, tx: Tx, saga_id: UUID) -> list[tuple[Any, ...]]:
        return tx.execute(self._timeline, (saga_id,)).fetchall()

    def list(self, tx: Tx, where: SagaFilter) -> list[SagaSummary]:
        """The sagas ``where`` selects, newest first."""
        rows = tx.execute(self._list, list_parameters(where)).fetchall()
        return [SagaSummary(*row) for row in rows]


class AsyncSagaStore:
    """The statements an app writes with, on a :class:`psycopg.AsyncConnection`.

    The same SQL and row mapping as :class:`SagaStore` (whose rendered
    statements it reuses); only the I/O is awaited.
    """

    def __init__(self, store: SagaStore) -> None:
        self.store = store

    async def insert(
        self,
        tx: AsyncTx,
        record: SagaRecord,
        fingerprint: str | None = None,
    ) -> bool:
        """Insert a new saga; False (nothing written) if its idempotency key is taken.
        ``fingerprint`` (of the data it started with) is kept with the key."""
        params = _insert_params(record, fingerprint)
        cur = await tx.execute(self.store._insert, params, prepare=True)
        return cur.rowcount == 1

    async def find_by_key(self, tx: AsyncTx, name: str, key: str) -> tuple[UUID, str | None] | None:
        """See :meth:`SagaStore.find_by_key`."""
        row = await (await tx.execute(self.store._by_key, (name, key))).fetchone()
        if row is None:
            return None
        saga_id, fingerprint = row
        return saga_id, fingerprint

    async def load(self, tx: AsyncTx, saga_id: UUID) -> SagaRecord | None:
        cur = tx.cursor(row_factory=dict_row)
        row = await (await cur.execute(self.store._load, (saga_id,), prepare=True)).fetchone()
        return None if row is None else _record(row)

    async def request_cancel(self, tx: AsyncTx, saga_id: UUID, reason: str) -> bool:
        """See :meth:`SagaStore.request_cancel`."""
        cur = await tx.execute(self.store._request_cancel, _cancel_params(saga_id, reason))
        return cur.rowcount == 1


def _insert_params(record: SagaRecord, fingerprint: str | None) -> tuple[Any, ...]:
    identity = (record.id, record.name, record.saga_version, record.service)
    return (*identity, record.idempotency_key, fingerprint, *_state_params(record))


def _state_params(record: SagaRecord) -> tuple[Any, ...]:
    """What a step changes in a saga's row, in the order the insert and update name it."""
    return (
        record.status.value,
        record.step,
        Jsonb(record.data),
        record.completed_steps,
        record.pending_message_id,
        record.step_attempt,
        record.cancel_requested,
        record.pivot_reached,
        record.last_error,
        record.step_started_at,
        record.failed_step,
        Jsonb(record.step_state),
        record.status.finished or record.status.needs_operator,
    )


def _cancel_params(saga_id: UUID, reason: str) -> tuple[str, UUID]:
    return f"cancelled: {reason}", saga_id


def _record(row: dict[str, Any]) -> SagaRecord:
    """A ``saga_instances`` row (selected as ``_COLUMNS``, by column name) as a record."""
    return SagaRecord(
        id=row["id"],
        name=row["name"],
        saga_version=row["saga_version"],
        service=row["service"],
        status=SagaStatus(row["status"]),
        step=row["step"],
        data=row["data"],
        completed_steps=list(row["completed_steps"]),
        pending_message_id=row["pending_message_id"],
        step_attempt=row["step_attempt"],
        cancel_requested=row["cancel_requested"],
        pivot_reached=row["pivot_reached"],
        last_error=row["last_error"],
        idempotency_key=row["idempotency_key"],
        version=row["version"],
        started_at=row["started_at"],
        updated_at=row["updated_at"],
        step_started_at=row["step_started_at"],
        finished_at=row["finished_at"],
        failed_step=row["failed_step"],
        step_state=row["step_state"],
    )


def records_of_documents(documents: Sequence[dict[str, Any]]) -> dict[UUID, SagaRecord]:
    """The records, by id, of rows a :meth:`SagaStore.documents_read` query returned."""
    records = {}
    for document in documents:
        row = dict(document)
        for key in _UUID_FIELDS:
            row[key] = None if row[key] is None else UUID(row[key])
        for key in _INSTANT_FIELDS:
            row[key] = None if row[key] is None else datetime.fromisoformat(row[key])
        record = _record(row)
        records[record.id] = record
    return records


def _row_document(record: SagaRecord) -> dict[str, Any]:
    """``record`` as one element of the JSON array :meth:`SagaStore.save_steps` sends."""
    return {
        "id": str(record.id),
        "version": record.version,
        "status": record.status.value,
        "step": record.step,
        "data": record.data,
        "completed_steps": record.completed_steps,
        "pending_message_id": _text(record.pending_message_id),
        "step_attempt": record.step_attempt,
        "cancel_requested": record.cancel_requested,
        "pivot_reached": record.pivot_reached,
        "last_error": record.last_error,
        "step_started_at": _text(record.step_started_at),
        "failed_step": record.failed_step,
        "step_state": record.step_state,
        "ended": record.status.finished or record.status.needs_operator,
    }


def _log_document(entry: StepLogEntry) -> dict[str, Any]:
    """``entry`` as one element of the JSON array a multi-row step-log insert sends."""
    return {
        "saga_id": str(entry.saga_id),
        "step": entry.step,
        "phase": entry.phase.value,
        "attempt": entry.attempt,
        "outcome": entry.outcome,
        "started_at": entry.started_at.isoformat(),
        "finished_at": entry.finished_at.isoformat(),
        "error": entry.error,
        "message_id": _text(entry.message_id),
    }


def _text(value: UUID | datetime | None) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, datetime) else str(value)
