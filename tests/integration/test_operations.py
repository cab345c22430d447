"""Failures and operations: retries, dead letters and replay, resume, stats, metrics, prune."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from saga import HandlerContext, Outbox, RetryPolicy, Service
from saga.consumers import DeliveryOutcome
from saga.messaging.envelope import Envelope
from saga.observability.metrics import Metrics
from saga.operations.retention import Pruner, RetentionPolicy
from tests.support import sagas as trips
from tests.support.brokers import TestBroker
from tests.support.cli import saga_cli
from tests.support.databases import TestDatabase
from tests.support.running import running_relay, running_service
from tests.support.services import EFFECTS_DDL, Flaky, Ping, service
from tests.support.wait import wait_until

JSON = "application/json"


@pytest.fixture(autouse=True)
def _effects_table(db: TestDatabase) -> None:
    db.execute(EFFECTS_DDL)


def count(db: TestDatabase, query: str, *params: Any) -> int:
    return int(db.scalar(query, params))


def effects(db: TestDatabase, kind: str, key: str | None = None) -> int:
    if key is None:
        return count(db, "SELECT count(*) FROM effects WHERE kind = %s", kind)
    return count(db, "SELECT count(*) FROM effects WHERE kind = %s AND key = %s", kind, key)


def test_always_failing_handler_gets_exact_attempts_while_others_flow(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    """2 immediate tries x (1 + 2 delayed retries) = 6 handler calls, then one dead letter."""
    policy = RetryPolicy(immediate_attempts=2, immediate_initial_wait=0, delays=(0.5, 0.5))
    busy = Service("busy", retry=policy)
    tries: list[float] = []

    @busy.handler(Flaky)
    def always_fails(tx: Any, msg: Flaky, ctx: HandlerContext) -> None:
        tries.append(time.monotonic())
        raise TimeoutError("gateway timeout")

    @busy.handler(Ping)
    def ping(tx: Any, msg: Ping, ctx: HandlerContext) -> None:
        tx.execute("INSERT INTO effects (kind, key) VALUES ('ping', %s)", (msg.key,))

    failing = Envelope.wrap(Flaky(key="doomed", fail_times=0))
    good = [Envelope.wrap(Ping(key=f"good-{i}")).to_bytes() for i in range(300)]
    with running_service(busy, db, rabbit) as runner:
        rabbit.publish_many(busy.name, [failing.to_bytes(), *good])
        # No relay yet, so the delayed retry cannot come back, however slow this machine:
        # the 300 behind the failing message must all be handled while it waits.
        wait_until(
            lambda: (
                (
                    runner.counts[DeliveryOutcome.HANDLED],
                    runner.counts[DeliveryOutcome.RETRY_SCHEDULED],
                )
                == (300, 1)
            ),
            what="300 handled while the failing one waits for its retry",
        )
        assert len(tries) == 2
        assert count(db, "SELECT count(*) FROM saga.outbox WHERE deliver_after IS NOT NULL") == 1
        with running_relay(db, rabbit):
            wait_until(
                lambda: runner.counts[DeliveryOutcome.DEAD_LETTERED] == 1, what="dead letter"
            )
        assert runner.counts[DeliveryOutcome.RETRY_SCHEDULED] == 2
    assert len(tries) == 6
    attempts, error_type = db.rows("SELECT attempts, error_type FROM saga.dead_letters")[0]
    assert (attempts, error_type) == (6, "TimeoutError")
    assert effects(db, "ping") == 300


def test_replay_after_fix_applies_once_and_a_second_replay_changes_nothing(
    db: TestDatabase, rabbit: TestBroker
) -> None:
    broken = Envelope.wrap(Flaky(key="fixed-later", fail_times=6))  # fails all 6 tries
    with running_service(service, db, rabbit) as runner, running_relay(db, rabbit):
        rabbit.publish_raw(service.name, broken.to_bytes(), JSON)
        wait_until(lambda: runner.counts[DeliveryOutcome.DEAD_LETTERED] == 1, what="dead letter")
        letter_id = db.scalar("SELECT id FROM saga.dead_letters")
        first = saga_cli(db.url, "dlq", "replay", str(letter_id))  # the 7th try succeeds: "fixed"
        assert first.returncode == 0, first.stderr
        wait_until(lambda: effects(db, "flaky-done", "fixed-later") == 1, what="replayed")
        second = saga_cli(db.url, "dlq", "replay", str(letter_id))
        assert second.returncode == 0, second.stderr
        wait_until(lambda: runner.counts[DeliveryOutcome.DUPLICATE] == 1, what="second replay seen")
    assert effects(db, "flaky-done", "fixed-later") == 1
    status, replays = db.rows("SELECT status, replay_count FROM saga.dead_letters")[0]
    assert (status, replays) == ("replayed", 2)
    history = db.rows("SELECT replayed, refused, dead_letter_ids FROM saga.dead_letter_replays")
    assert history == [(1, 0, [letter_id]), (1, 0, [letter_id])]
    listed = json.loads(saga_cli(db.url, "dlq", "list", "--status", "all", "--json").stdout)
    assert listed[0]["message_id"] == str(broken.message_id)


def _dead_letter(
    db: TestDatabase, message: BaseModel, error_type: str, consumer: str = "svc"
) -> int:
    envelope = Envelope.wrap(message)
    return int(
        db.scalar(
            "INSERT INTO saga.dead_letters (consumer, reason, message_id, message_type, "
            "destination, content_type, body, error_type, error_message) VALUES "
            "(%s, 'failed', %s, %s, %s, 'application/json', %s, %s, 'boom') RETURNING id",
            (
                consumer,
                envelope.message_id,
                envelope.type,
                consumer,
                envelope.to_bytes(),
                error_type,
            ),
        )
    )


def test_replay_by_error_type_dry_run_lists_and_changes_nothing(db: TestDatabase) -> None:
    for i in range(3):
        _dead_letter(db, Ping(key=f"t{i}"), "GatewayTimeout")
    _dead_letter(db, Ping(key="other"), "KeyError")
    result = saga_cli(
        db.url, "dlq", "replay", "--error-type", "GatewayTimeout", "--since", "1h", "--dry-run"
    )
    assert result.returncode == 0, result.stderr
    assert "3 dead letter(s) would be replayed" in result.stdout
    assert count(db, "SELECT count(*) FROM saga.outbox") == 0
    assert count(db, "SELECT count(*) FROM saga.dead_letters WHERE status = 'pending'") == 4
    assert count(db, "SELECT count(*) FROM saga.dead_letter_replays") == 0
    real = saga_cli(db.url, "dlq", "replay", "--error-type", "GatewayTimeout", "--since", "1h")
    assert "replayed 3 dead letter(s)" in real.stdout
    assert count(db, "SELECT count(*) FROM saga.outbox") == 3
    headers = [
        Envelope.from_bytes(bytes(b[0])).headers for b in db.rows("SELECT body FROM saga.outbox")
    ]
    assert all(h["attempt"] == "1" and "replayed_from" in h for h in headers)


def test_many_dead_letters_replay_in_recorded_batches_with_progress(db: TestDatabase) -> None:
    for i in range(450):
        _dead_letter(db, Ping(key=f"k{i}"), "GatewayTimeout")
    result = saga_cli(db.url, "dlq", "replay", "--error-type", "GatewayTimeout")
    assert "replayed 450 dead letter(s)" in result.stdout, result.stderr
    assert count(db, "SELECT count(*) FROM saga.outbox") == 450
    assert count(db, "SELECT sum(replayed) FROM saga.dead_letter_replays") == 450
    assert count(db, "SELECT count(*) FROM saga.dead_letter_replays") == 3  # batches of 200


def test_dlq_show_masks_secrets_unless_revealed(db: TestDatabase) -> None:
    class Payment(BaseModel):
        order_id: str
        card_number: str
        owner: dict[str, str]

    letter = _dead_letter(
        db,
        Payment(order_id="o-1", card_number="4111111111111111", owner={"password": "hunter2"}),
        "Declined",
    )
    masked = saga_cli(db.url, "dlq", "show", str(letter), "--json")
    shown = json.loads(masked.stdout)
    assert shown["payload"] == {
        "order_id": "o-1",
        "card_number": "***",
        "owner": {"password": "***"},
    }
    assert "4111111111111111" not in masked.stdout and "hunter2" not in masked.stdout
    table = saga_cli(db.url, "dlq", "show", str(letter))
    assert "4111111111111111" not in table.stdout and "masked" in table.stdout
    revealed = json.loads(saga_cli(db.url, "dlq", "show", str(letter), "--reveal", "--json").stdout)
    assert revealed["payload"]["card_number"] == "4111111111111111"
    assert revealed["payload"]["owner"]["password"] == "hunter2"


def test_purge_and_unknown_ids(db: TestDatabase) -> None:
    keep = _dead_letter(db, Ping(key="new"), "E")
    old = _dead_letter(db, Ping(key="old"), "E")
    db.execute(
        "UPDATE saga.dead_letters SET last_failed_at = now() - interval '10 days' WHERE id = %s",
        (old,),
    )
    dry = saga_cli(db.url, "dlq", "purge", "--before", "7d", "--dry-run")
    assert "1 dead letter(s) would be purged" in dry.stdout
    assert "purged 1" in saga_cli(db.url, "dlq", "purge", "--before", "7d").stdout
    statuses = dict(db.rows("SELECT id, status FROM saga.dead_letters"))
    assert statuses == {keep: "pending", old: "purged"}
    refused = saga_cli(db.url, "dlq", "replay", str(old))
    assert refused.returncode == 1 and "purged" in refused.stdout
    missing = saga_cli(db.url, "dlq", "replay", "999999")
    assert missing.returncode == 1 and "no dead letters with ids [999999]" in missing.stderr


def test_delayed_retry_does_not_hold_a_worker(db: TestDatabase, rabbit: TestBroker) -> None:
    """An hour's retry delay: a worker that waited it out (asleep, or in process) would never
    get to the 50 pings behind the failing message."""
    delay = timedelta(hours=1)
    slow = Service(
        "slowretry",
        retry=RetryPolicy(immediate_attempts=1, delays=(delay.total_seconds(),), delay_jitter=0),
    )
    tries: list[datetime] = []  # each try's transaction start, the clock of deliver_after

    @slow.handler(Flaky)
    def flaky(tx: Any, msg: Flaky, ctx: HandlerContext) -> None:
        tries.append(tx.execute("SELECT now()").fetchone()[0])
        if len(tries) == 1:
            raise RuntimeError("first try fails")
        tx.execute("INSERT INTO effects (kind, key) VALUES ('flaky-done', %s)", (msg.key,))

    @slow.handler(Ping)
    def ping(tx: Any, msg: Ping, ctx: HandlerContext) -> None:
        tx.execute("INSERT INTO effects (kind, key) VALUES ('ping', %s)", (msg.key,))

    with running_service(slow, db, rabbit, concurrency=1, prefetch=1):
        rabbit.publish_raw(slow.name, Envelope.wrap(Flaky(key="f", fail_times=1)).to_bytes(), JSON)
        for i in range(50):
            rabbit.publish_raw(slow.name, Envelope.wrap(Ping(key=f"p{i}")).to_bytes(), JSON)
        wait_until(lambda: effects(db, "ping") == 50, what="50 pings")
        assert len(tries) == 1
        (due,) = db.rows("SELECT deliver_after FROM saga.outbox WHERE deliver_after IS NOT NULL")
        # parked in the outbox for the whole delay, counted from the start of the failure
        # path's transaction: a lone delivery's, which begins once its first try rolled back
        assert tries[0] + delay <= due[0] < tries[0] + delay + timedelta(minutes=1)
        db.execute("UPDATE saga.outbox SET deliver_after = now()")  # the hour goes by
        with running_relay(db, rabbit):
            wait_until(lambda: effects(db, "flaky-done", "f") == 1, what="the retry")
    assert len(tries) == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_metrics_match_the_database(db: TestDatabase, rabbit: TestBroker) -> None:
    metrics = Metrics()
    metrics.watch_database(db.url, "saga")
    port = _free_port()
    metrics.serve(port, "127.0.0.1")
    with db.connect(autocommit=False) as conn, conn.transaction():
        for i in range(7):
            Outbox().add(conn, Ping(key=f"q{i}"), destination="nobody")
        Outbox().add(
            conn, Ping(key="later"), destination="nobody", deliver_after=timedelta(hours=1)
        )
    _dead_letter(db, Ping(key="a"), "E", consumer="svc-a")
    _dead_letter(db, Ping(key="b"), "E", consumer="svc-a")
    _dead_letter(db, Ping(key="c"), "E", consumer="svc-b")
    # The oldest ready row written an hour ago; the scheduled one, older still, is not ready.
    db.execute(
        "UPDATE saga.outbox SET created_at = created_at - interval '1 hour' "
        "WHERE id = (SELECT min(id) FROM saga.outbox WHERE deliver_after IS NULL)"
    )
    db.execute(
        "UPDATE saga.outbox SET created_at = created_at - interval '2 hours' "
        "WHERE deliver_after IS NOT NULL"
    )
    oldest = "SELECT extract(epoch FROM now() - min(created_at)) FROM saga.outbox "
    oldest += "WHERE deliver_after IS NULL"
    age_before = float(db.scalar(oldest))
    scraped = _scrape(port)
    age_after = float(db.scalar(oldest))
    assert scraped["saga_metrics_database_up"] == 1
    assert (
        scraped["saga_outbox_depth"]
        == count(db, "SELECT count(*) FROM saga.outbox WHERE deliver_after IS NULL")
        == 7
    )
    assert scraped["saga_outbox_scheduled"] == 1
    assert 3600 <= age_before <= scraped["saga_outbox_oldest_age_seconds"] <= age_after
    assert scraped['saga_dead_letters_pending{consumer="svc-a",reason="failed"}'] == 2
    assert scraped['saga_dead_letters_pending{consumer="svc-b",reason="failed"}'] == 1

    runner_metrics = Metrics()
    with running_service(service, db, rabbit, metrics=runner_metrics) as runner:
        rabbit.publish_raw(service.name, Envelope.wrap(Ping(key="m")).to_bytes(), JSON)
        rabbit.publish_raw(service.name, b"junk", JSON)
        wait_until(lambda: sum(runner.counts.values()) == 2, what="two deliveries")
    handled = runner_metrics.handled.labels(service.name, "handled")._value.get()
    rejected = runner_metrics.dead_lettered.labels(service.name, "rejected")._value.get()
    assert (handled, rejected) == (1, 1)
    # both deliveries were committed, together or one per transaction
    assert runner_metrics.batch_size.labels(service.name)._sum.get() == 2


def test_prune_keeps_the_dedup_window(db: TestDatabase, rabbit: TestBroker) -> None:
    recent = Envelope.wrap(Ping(key="recent"))
    with running_service(service, db, rabbit) as runner:
        rabbit.publish_raw(service.name, recent.to_bytes(), JSON)
        wait_until(lambda: runner.counts[DeliveryOutcome.HANDLED] == 1, what="handled")
    db.execute(
        "INSERT INTO saga.inbox (consumer, message_id, received_at) "
        "SELECT 'old', gen_random_uuid(), now() - interval '40 days' FROM generate_series(1, 1200)"
    )
    db.execute(
        "INSERT INTO saga.inbox_replies (consumer, message_id, reply_id, destination, "
        "message_type, body, sent_at) SELECT 'old', gen_random_uuid(), gen_random_uuid(), 'x', "
        "'Pong', '{}', now() - interval '40 days' FROM generate_series(1, 700)"
    )
    pruner = Pruner("saga", RetentionPolicy(batch_size=500))
    with db.connect(autocommit=False) as conn:
        assert pruner.count(conn).deleted["inbox"] == 1200
        assert pruner.count(conn).deleted["inbox_replies"] == 700
        report = pruner.prune(conn)
    assert report.deleted["inbox"] == 1200
    assert report.deleted["inbox_replies"] == 700
    assert count(db, "SELECT count(*) FROM saga.inbox_replies") == 0
    assert count(db, "SELECT count(*) FROM saga.inbox") == 1
    with running_service(service, db, rabbit) as runner:
        rabbit.publish_raw(service.name, recent.to_bytes(), JSON)  # a late duplicate
        wait_until(lambda: runner.counts[DeliveryOutcome.DUPLICATE] == 1, what="duplicate rejected")
    assert effects(db, "ping", "recent") == 1


def test_prune_removes_finished_sagas_and_old_replayed_letters_only(db: TestDatabase) -> None:
    done = trips.trip  # a finished saga, made old
    with db.connect(autocommit=False) as conn, conn.transaction():
        finished = done.start(conn, trips.TripData(trip_id="old"))
        waiting = done.start(conn, trips.TripData(trip_id="new"))
    db.execute(
        "UPDATE saga.saga_instances SET status = 'completed', "
        "finished_at = now() - interval '60 days' WHERE id = %s",
        (finished,),
    )
    old_letter = _dead_letter(db, Ping(key="x"), "E")
    pending_letter = _dead_letter(db, Ping(key="y"), "E")
    db.execute(
        "UPDATE saga.dead_letters SET status = 'replayed', "
        "last_replayed_at = now() - interval '20 days' WHERE id = %s",
        (old_letter,),
    )
    result = saga_cli(db.url, "db", "prune")
    assert result.returncode == 0, result.stderr
    assert "deleted 1 sagas row(s)" in result.stdout
    assert [r[0] for r in db.rows("SELECT id FROM saga.saga_instances")] == [waiting]
    assert count(db, "SELECT count(*) FROM saga.saga_steps WHERE saga_id = %s", finished) == 0
    assert [r[0] for r in db.rows("SELECT id FROM saga.dead_letters")] == [pending_letter]
    refused = saga_cli(
        db.url, "db", "prune", "--dedup-window", "7d", "--dead-letter-retention", "14d"
    )
    assert refused.returncode == 2 and "must be longer" in refused.stderr


@pytest.fixture
def trips_running(db: TestDatabase, rabbit: TestBroker) -> Iterator[None]:
    with (
        running_relay(db, rabbit),
        running_service(trips.registry.as_service(), db, rabbit),
        running_service(trips.bank, db, rabbit),
    ):
        yield


def _status(db: TestDatabase, saga_id: Any) -> str:
    return str(db.scalar("SELECT status FROM saga.saga_instances WHERE id = %s", (saga_id,)))


def test_resume_a_saga_whose_compensation_failed_once_the_cause_is_fixed(
    db: TestDatabase, trips_running: None
) -> None:
    with db.connect(autocommit=False) as conn, conn.transaction():
        saga_id = trips.trip.start(
            conn, trips.TripData(trip_id="r1", book_fails=True, refund_failures=10_000)
        )
    wait_until(lambda: _status(db, saga_id) == "compensation_failed", what="compensation_failed")
    stats = json.loads(saga_cli(db.url, "stats", "--json").stdout)
    assert stats["counts"]["book_trip"] == {"compensation_failed": 1}
    trips.FIXED_REFUNDS.add("ch-r1")
    result = saga_cli(db.url, "resume", str(saga_id), "--reason", "refund API fixed")
    assert result.returncode == 0, result.stderr
    wait_until(lambda: _status(db, saga_id) == "compensated", what="compensated after resume")
    assert effects(db, "refund") == 1 and effects(db, "close") == 1
    assert db.scalar("SELECT status FROM saga.dead_letters") == "replayed"
    again = saga_cli(db.url, "resume", str(saga_id))
    assert again.returncode == 1 and "nothing to resume" in again.stderr


def test_resume_refuses_a_saga_that_is_making_progress(db: TestDatabase) -> None:
    with db.connect(autocommit=False) as conn, conn.transaction():
        saga_id = trips.trip.start(conn, trips.TripData(trip_id="r2"))
    result = saga_cli(db.url, "resume", str(saga_id))
    assert result.returncode == 1 and "not stuck" in result.stderr
    forced = saga_cli(db.url, "resume", str(saga_id), "--stuck-after", "0s")
    assert forced.returncode == 0, forced.stderr
    assert count(db, "SELECT count(*) FROM saga.outbox WHERE message_type = 'saga.ResumeSaga'") == 1
    stats = json.loads(saga_cli(db.url, "stats", "--json", "--stuck-after", "0s").stdout)
    assert stats["stuck_count"] == 1 and stats["stuck"][0]["id"] == str(saga_id)
