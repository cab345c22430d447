"""The PostgreSQL broker's ring of generations: a drained generation is truncated whatever
snapshot is held, what it still holds moves forward with its lease, and nothing published
or taken while a pass runs is lost."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg import sql

from saga.broker.postgres.rotation import Rotation
from tests.support.brokers import TestBroker

SCHEMA = "saga_broker"


def _passes(broker: TestBroker, count: int) -> None:
    """``count`` rotation passes, each allowed to move the current generation on."""
    rotation = Rotation(SCHEMA, interval=0)
    with psycopg.connect(broker.url, autocommit=True) as db:
        for _ in range(count):
            rotation.run(db)


def _table_bytes(broker: TestBroker) -> int:
    """Heap and indexes of every generation's partition."""
    with psycopg.connect(broker.url) as conn:
        row = conn.execute(
            "SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits "
            "WHERE inhparent = 'saga_broker.messages'::regclass"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _consume_all(channel: Any, queue: str) -> int:
    consumed = 0
    while taken := channel.claim([queue], 500):
        channel.settle([p["properties"]["delivery_tag"] for p, _ in taken], delete=True)
        consumed += len(taken)
    channel.flush_acks()
    return consumed


def test_a_held_snapshot_and_20000_consumed_leave_a_small_table_after_rotation(
    pg_broker: TestBroker,
) -> None:
    """Vacuum cannot reclaim what a held snapshot may still see; truncating a drained
    generation does not ask it: the table shrinks to its live messages."""
    pg_broker.declare("svc")
    queue = pg_broker.topology.queue_name("svc")
    _passes(pg_broker, 2)  # whatever earlier tests left is gone: a fresh current generation
    with psycopg.connect(pg_broker.url) as holder, pg_broker.config.connect() as conn:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT txid_current()")  # the snapshot and an xid, as a report holds
        channel = conn.channel()
        _fill(pg_broker, queue, 20_000)
        assert _consume_all(channel, queue) == 20_000
        with psycopg.connect(pg_broker.url, autocommit=True) as db:
            db.execute("VACUUM saga_broker.messages")  # reclaims nothing behind the snapshot
        bloated = _table_bytes(pg_broker)
        _passes(pg_broker, 2)  # the generation of the 20,000 stops being current, then goes
        after = _table_bytes(pg_broker)
        holder.rollback()
    assert bloated > 5_000_000, f"20,000 consumed left only {bloated} bytes"
    assert after < 500_000, f"{after} bytes after rotation, {bloated} before"


def _row(broker: TestBroker, row_id: int) -> tuple[Any, ...] | None:
    with psycopg.connect(broker.url) as conn:
        return conn.execute(
            "SELECT generation, lock_token, attempts, visible_at FROM saga_broker.messages "
            "WHERE id = %s",
            (row_id,),
        ).fetchone()


def test_a_delayed_and_a_leased_message_survive_a_rotation_with_their_fencing(
    pg_broker: TestBroker,
) -> None:
    pg_broker.declare("svc")
    queue = pg_broker.topology.queue_name("svc")
    pg_broker.publish_many("svc", [b'"leased"'])
    pg_broker.publish_many("svc", [b'"delayed"'], headers={"x-delay": 3_600_000})
    with pg_broker.config.connect() as conn:
        channel = conn.channel()
        ((payload, _),) = channel.claim([queue], 10)
        assert payload["body"] == b'"leased"'
        tag = payload["properties"]["delivery_tag"]
        leased_id, token = int(tag.split(":")[0]), tag.split(":")[1]
        with psycopg.connect(pg_broker.url) as conn_:
            (delayed_id,) = conn_.execute(
                "SELECT id FROM saga_broker.messages WHERE queue = %s AND id <> %s",
                (queue, leased_id),
            ).fetchone() or (None,)
        leased, delayed = _row(pg_broker, leased_id), _row(pg_broker, delayed_id)
        assert leased is not None and delayed is not None
        _passes(pg_broker, 2)  # their generation stops being current, then is truncated
        moved_leased, moved_delayed = _row(pg_broker, leased_id), _row(pg_broker, delayed_id)
        assert moved_leased is not None and moved_delayed is not None
        assert moved_leased[0] != leased[0] and moved_delayed[0] != delayed[0]  # moved
        assert moved_leased[1:] == leased[1:] and moved_delayed[1:] == delayed[1:]  # kept
        assert str(moved_leased[1]) == token
        channel.settle([f"{delayed_id}:{uuid.uuid4()}:{delayed[0]}"], delete=True)  # a stale token
        channel.settle([tag], delete=True)
        channel.flush_acks()
    assert _row(pg_broker, leased_id) is None  # the fenced ack found it in its new place
    assert _row(pg_broker, delayed_id) == moved_delayed  # the wrong token deleted nothing


def test_a_leased_message_moved_by_a_rotation_is_released_where_it_went(
    pg_broker: TestBroker,
) -> None:
    """A release addresses the generation the message was taken from; the rotation moved
    it since: it is released in its new place, once, and taken again."""
    pg_broker.declare("svc")
    queue = pg_broker.topology.queue_name("svc")
    pg_broker.publish_many("svc", [b'"leased"'])
    with pg_broker.config.connect() as conn:
        channel = conn.channel()
        ((payload, _),) = channel.claim([queue], 10)
        tag = payload["properties"]["delivery_tag"]
        row_id = int(tag.split(":")[0])
        taken = _row(pg_broker, row_id)
        _passes(pg_broker, 2)  # its generation stops being current, then is truncated
        moved = _row(pg_broker, row_id)
        channel.settle([tag], delete=False)
        released = _row(pg_broker, row_id)
        ((again, _),) = channel.claim([queue], 10)
    assert taken is not None and moved is not None and released is not None
    assert moved[0] != taken[0] and released[0] == moved[0]
    assert taken[1] is not None and released[1] is None  # the lease is given back
    assert again["body"] == b'"leased"' and again["redelivered"]


def _explain_prepared(db: psycopg.Connection[Any], prefix: str, params: Any) -> Any:
    """The plan, as run, of the statement ``db`` prepared whose text starts with
    ``prefix``, run with ``params`` under the plan ``db`` chooses for it. It takes effect:
    a rollback would make psycopg forget the statements it prepared."""
    row = db.execute(
        "SELECT name, parameter_types::text[] FROM pg_prepared_statements "
        "WHERE starts_with(statement, %s)",
        (prefix,),
    ).fetchone()
    assert row is not None, f"no statement starting with {prefix!r} was prepared"
    name, types = row
    explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {}({})").format(
        sql.Identifier(name),
        sql.SQL(", ").join(sql.SQL("%s::{}").format(sql.SQL(t)) for t in types),
    )
    plan = psycopg.ClientCursor(db).execute(explain, params).fetchone()  # EXECUTE's values
    assert plan is not None
    return plan[0][0]


def _rows_read(node: dict[str, Any]) -> int:
    """The rows the scans of a plan's partitions read: those they returned, and those
    their filter removed."""
    rows = 0
    if node.get("Relation Name", "").startswith("messages_") and "Scan" in node["Node Type"]:
        returned = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        rows += returned * node["Actual Loops"]
    return rows + sum(_rows_read(child) for child in node.get("Plans", []))


def test_a_generation_filled_after_the_claim_and_ack_were_planned_is_read_by_its_indexes(
    pg_broker: TestBroker,
) -> None:
    """A generation is empty (truncated, then vacuumed) when it becomes current, and fills
    within seconds while the channel's statements, prepared on it meanwhile, keep
    running. With 20,000 messages in it (not yet analyzed), a claim of 100 and their
    fenced ack read about a hundred messages each, not the whole generation (as a plan
    made while it was empty and kept would)."""
    pg_broker.declare("svc")
    queue = pg_broker.topology.queue_name("svc")
    _passes(pg_broker, 2)  # whatever earlier tests left is gone: a fresh current generation
    with psycopg.connect(pg_broker.url, autocommit=True) as db:
        db.execute("VACUUM saga_broker.messages")  # as the channel does every 10 s
        (generation,) = db.execute("SELECT generation FROM saga_broker.ring").fetchone() or (0,)
    with pg_broker.config.connect() as conn:
        channel = conn.channel()
        for _ in range(12):  # prepared (5 runs), then past PostgreSQL's first plans (5 more)
            _fill(pg_broker, queue, 1)
            assert _take_and_ack(channel, queue) == 1
        _fill(pg_broker, queue, 20_000)
        token = uuid.uuid4()
        _, claim_params = channel.claim_query([queue], 100, token)
        claim = _explain_prepared(channel.db, "WITH next AS", claim_params)
        with psycopg.connect(pg_broker.url) as reader:
            ids = [r[0] for r in reader.execute(_TAKEN_UNDER, (token,)).fetchall()]
        ack_statement = f'DELETE FROM "saga_broker"."messages_{generation}"'
        ack = _explain_prepared(channel.db, ack_statement, (ids, [token] * 100, ids))
        with psycopg.connect(pg_broker.url) as reader:
            left = reader.execute(_TAKEN_UNDER, (token,)).fetchall()
    assert len(ids) == 100 and left == []
    claim_read, ack_read = _rows_read(claim["Plan"]), _rows_read(ack["Plan"])
    assert claim_read < 1_000, f"a claim of 100 read {claim_read} of 20,000 messages"
    assert ack_read < 1_000, f"the ack of 100 read {ack_read} of 20,000 messages"


def _take_and_ack(channel: Any, queue: str) -> int:
    """A claim of 100 and its ack, as a consumer runs them; the messages taken."""
    tags = [p["properties"]["delivery_tag"] for p, _ in channel.claim([queue], 100)]
    channel.settle(tags, delete=True)
    channel.flush_acks()
    return len(tags)


def _fill(broker: TestBroker, queue: str, count: int) -> None:
    with psycopg.connect(broker.url) as writer:
        writer.execute(
            "INSERT INTO saga_broker.messages (queue, body) "
            "SELECT %s, convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, %s)",
            (queue, count),
        )


_TAKEN_UNDER = "SELECT id FROM saga_broker.messages WHERE lock_token = %s"


def test_the_claim_runs_on_a_kept_plan(pg_broker: TestBroker) -> None:
    """Planning the claim's three partition arms costs more than a tenth of what the
    consumer's backend spends on a message: once prepared, the claim is not planned
    again (left to choose, PostgreSQL would plan every claim afresh)."""
    pg_broker.declare("svc")
    queue = pg_broker.topology.queue_name("svc")
    with pg_broker.config.connect() as conn:
        channel = conn.channel()
        for _ in range(12):
            _fill(pg_broker, queue, 1)
            assert _take_and_ack(channel, queue) == 1
        plans = channel.db.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE starts_with(statement, 'WITH next AS')"
        ).fetchone()
    assert plans is not None and plans[0] > 0 and plans[1] == 0, plans


def test_the_insert_of_a_batch_is_not_compiled(pg_broker: TestBroker) -> None:
    """The broker's statements are planned with scans priced out: that alone would make
    each look costly enough for PostgreSQL to compile it (JIT, 200 ms a statement)."""
    pg_broker.declare("svc")
    queue = pg_broker.topology.queue_name("svc")
    with pg_broker.config.connect() as conn:
        channel = conn.channel()
        for n in range(6):  # prepared after five
            channel.insert([("", queue, {"body": b"%d" % n, "properties": {}, "headers": {}})])
        row = ["", queue, b"x", "{}", "{}", 0.0]
        plan = _explain_prepared(channel.db, "\nINSERT INTO", [[v] for v in row])
    assert "JIT" not in plan, plan["JIT"]


def _queue_rows(broker: TestBroker, queue: str) -> int:
    with psycopg.connect(broker.url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM saga_broker.messages WHERE queue = %s", (queue,)
        ).fetchone()
    return int(row[0]) if row else 0


class _Race:
    """Publishers, consumers and a rotator on threads; any error stops them all."""

    def __init__(self, broker: TestBroker, per_publisher: int) -> None:
        self.broker = broker
        self.queue = broker.topology.queue_name("svc")
        self.per_publisher = per_publisher
        self.published = [f"p{p}-{n}".encode() for p in range(2) for n in range(per_publisher)]
        self.received: Counter[bytes] = Counter()
        self.received_lock = threading.Lock()
        self.publishing_done = threading.Event()
        self.stop = threading.Event()
        self.passes = 0
        self.errors: list[BaseException] = []

    def thread(self, target: Any, *args: Any) -> threading.Thread:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:
                self.errors.append(exc)
                self.stop.set()

        return threading.Thread(target=run)

    def publish(self, p: int) -> None:
        bodies = self.published[p * self.per_publisher : (p + 1) * self.per_publisher]
        for start in range(0, len(bodies), 50):
            self.broker.publish_many("svc", bodies[start : start + 50])

    def consume(self) -> None:
        with self.broker.config.connect() as conn:
            channel = conn.channel()
            while not self.stop.is_set():
                taken = channel.claim([self.queue], 100)
                with self.received_lock:
                    self.received.update(payload["body"] for payload, _ in taken)
                channel.settle([p["properties"]["delivery_tag"] for p, _ in taken], delete=True)
                channel.flush_acks()
                done = self.publishing_done.is_set() and not taken
                if done and _queue_rows(self.broker, self.queue) == 0:
                    self.stop.set()  # everything published is consumed (or lost)

    def rotate(self) -> None:
        rotation = Rotation(SCHEMA, interval=0)
        with psycopg.connect(self.broker.url, autocommit=True) as db:
            while not self.stop.is_set():
                rotation.run(db)
                self.passes += 1


@pytest.mark.slow
def test_publishers_and_consumers_racing_rotations_lose_nothing(pg_broker: TestBroker) -> None:
    """Two publishers and two consumers run while passes rotate the ring as fast as they
    can: every message is received, and once (leases outlast the test)."""
    pg_broker.declare("svc")
    race = _Race(pg_broker, per_publisher=3_000)
    publishers = [race.thread(race.publish, p) for p in range(2)]
    others = [race.thread(race.consume) for _ in range(2)] + [race.thread(race.rotate)]
    for thread in publishers + others:
        thread.start()
    for thread in publishers:
        thread.join()
    race.publishing_done.set()
    for thread in others:
        thread.join()
    assert not race.errors, race.errors
    assert race.passes > 10, f"only {race.passes} rotation passes ran beside the traffic"
    missing = set(race.published) - set(race.received)
    twice = {body for body, n in race.received.items() if n > 1}
    assert not missing and not twice, f"{len(missing)} lost, {len(twice)} received twice"


_FIRST_LAYOUT = """
DROP SCHEMA IF EXISTS {s} CASCADE;
CREATE SCHEMA {s};
CREATE TABLE {s}.messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    body bytea NOT NULL,
    headers jsonb NOT NULL DEFAULT '{{}}',
    properties jsonb NOT NULL DEFAULT '{{}}',
    visible_at timestamptz NOT NULL DEFAULT now(),
    lock_token uuid,
    attempts integer NOT NULL DEFAULT 0,
    enqueued_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX messages_ready ON {s}.messages (queue, visible_at, id);
INSERT INTO {s}.messages (queue, body) VALUES ('q', 'ready'), ('q', 'taken');
UPDATE {s}.messages SET lock_token = '00000000-0000-0000-0000-00000000000a',
    attempts = 1, visible_at = now() + interval '1 hour' WHERE body = 'taken';
"""


def test_a_table_of_the_first_layout_becomes_a_ring_with_its_messages(
    pg_broker: TestBroker,
) -> None:
    """An unpartitioned table left by an earlier version is converted on first connect:
    its messages keep their ids, leases and attempts, and new ids follow theirs."""
    schema = f"upgrade_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_broker.url, autocommit=True) as db:
        db.execute(_FIRST_LAYOUT.format(s=schema).encode())
        before = db.execute(
            f"SELECT id, body, lock_token, attempts FROM {schema}.messages ORDER BY id"
        ).fetchall()
    try:
        with pg_broker.config.connect() as conn:
            conn.transport_options["schema"] = schema
            channel = conn.channel()
            ((payload, _),) = channel.claim(["q"], 10)
            assert payload["body"] == b"ready"
        with psycopg.connect(pg_broker.url) as db:
            kind = db.execute(
                "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", (f"{schema}.messages",)
            ).fetchone()
            after = db.execute(
                f"SELECT id, body, lock_token, attempts FROM {schema}.messages ORDER BY id"
            ).fetchall()
            db.execute(f"INSERT INTO {schema}.messages (queue, body) VALUES ('q', 'new')")
            (new_id,) = db.execute(
                f"SELECT id FROM {schema}.messages WHERE body = 'new'"
            ).fetchone() or (0,)
    finally:
        with psycopg.connect(pg_broker.url, autocommit=True) as db:
            db.execute(f"DROP SCHEMA {schema} CASCADE".encode())
    assert kind == ("p",)
    assert [row[1:] for row in after[1:]] == [row[1:] for row in before[1:]]  # the leased one
    assert [row[0] for row in after] == [row[0] for row in before]
    assert new_id > max(row[0] for row in before)


def test_a_ring_keyed_on_id_and_generation_gets_a_key_per_partition(
    pg_broker: TestBroker,
) -> None:
    """A ring made by an earlier version (one key on ``(id, generation)`` for the whole
    table) is given a key on ``id`` per partition on first connect, its messages kept."""
    schema = f"upgrade_{uuid.uuid4().hex[:8]}"
    with pg_broker.config.connect() as conn:
        conn.transport_options["schema"] = schema
        conn.channel()
    with psycopg.connect(pg_broker.url, autocommit=True) as db:
        for n in range(3):
            db.execute(f"ALTER TABLE {schema}.messages_{n} DROP CONSTRAINT messages_{n}_pkey")
        db.execute(f"ALTER TABLE {schema}.messages ADD PRIMARY KEY (id, generation)")
        db.execute(f"INSERT INTO {schema}.messages (queue, body) VALUES ('q', 'kept')")
    try:
        with pg_broker.config.connect() as conn:
            conn.transport_options["schema"] = schema
            ((payload, _),) = conn.channel().claim(["q"], 10)
        with psycopg.connect(pg_broker.url) as db:
            keys = db.execute(
                "SELECT c.relname, pg_get_constraintdef(k.oid) FROM pg_constraint k "
                "JOIN pg_class c ON c.oid = k.conrelid WHERE k.contype = 'p' "
                "AND k.connamespace = %s::regnamespace AND c.relname LIKE 'messages%%' "
                "ORDER BY c.relname",
                (schema,),
            ).fetchall()
    finally:
        with psycopg.connect(pg_broker.url, autocommit=True) as db:
            db.execute(f"DROP SCHEMA {schema} CASCADE".encode())
    assert payload["body"] == b"kept"
    assert keys == [(f"messages_{n}", "PRIMARY KEY (id)") for n in range(3)]
