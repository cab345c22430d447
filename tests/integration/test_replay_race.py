"""Two operators replay (or purge) the same dead letter at the same moment: it happens once.

Both ``saga dlq`` processes read the letter, then queue behind a lock the test holds on
its row; let go together, the first sends it and the second is told it was done
meanwhile, instead of sending it again from what it read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from saga.examples.order_saga.processes import SagaProcess
from saga.messaging.envelope import Envelope
from tests.support.databases import TestDatabase
from tests.support.services import Ping
from tests.support.wait import wait_until


def _letter(db: TestDatabase, reply_to: str | None = None) -> int:
    body = Envelope.wrap(Ping(key="once"), reply_to=reply_to).to_bytes()
    return int(
        db.scalar(
            "INSERT INTO saga.dead_letters (consumer, reason, destination, content_type, body, "
            "error_type, error_message) VALUES ('effects', 'failed', 'effects', "
            "'application/json', %s, 'E', 'boom') RETURNING id",
            (body,),
        )
    )


@contextmanager
def _both_waiting_on(db: TestDatabase, letter_id: int) -> Iterator[None]:
    """Hold the letter's row until both operators' processes wait for it, then let go."""
    with db.connect(autocommit=False) as gate, gate.transaction():
        gate.execute("SELECT 1 FROM saga.dead_letters WHERE id = %s FOR UPDATE", (letter_id,))
        yield
        wait_until(lambda: db.waiting_on_locks() == 2, what="both operators waiting on it")


def _operator(db: TestDatabase, tmp_path: Path, name: str, *args: str) -> SagaProcess:
    env = {"SAGA_DATABASE_URL": db.url, "COLUMNS": "200"}
    return SagaProcess(["dlq", *args], env, tmp_path, name)


def test_two_operators_replaying_one_letter_at_once_send_it_once(
    db: TestDatabase, tmp_path: Path
) -> None:
    letter = _letter(db)
    with _both_waiting_on(db, letter):
        operators = [_operator(db, tmp_path, n, "replay", str(letter)) for n in ("a", "b")]
    codes = sorted(operator.wait(60) for operator in operators)
    outputs = [operator.output() for operator in operators]
    assert codes == [0, 1], outputs  # the second replayed nothing and says so
    assert sum("replayed 1 dead letter(s)" in out for out in outputs) == 1, outputs
    assert sum("replayed by someone else meanwhile" in out for out in outputs) == 1, outputs
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 1
    assert db.rows("SELECT status, replay_count FROM saga.dead_letters") == [("replayed", 1)]
    again = _operator(db, tmp_path, "later", "replay", str(letter))  # on purpose: it goes
    assert again.wait(60) == 0, again.output()
    assert db.scalar("SELECT count(*) FROM saga.outbox") == 2


def test_two_operators_purging_a_sagas_request_at_once_answer_the_saga_once(
    db: TestDatabase, tmp_path: Path
) -> None:
    letter = _letter(db, reply_to="orders")  # a saga waits for its answer
    with _both_waiting_on(db, letter):
        operators = [_operator(db, tmp_path, n, "purge", str(letter)) for n in ("a", "b")]
    assert [operator.wait(60) for operator in operators] == [0, 0]
    assert db.scalar("SELECT count(*) FROM saga.outbox WHERE destination = 'orders'") == 1
    assert db.scalar("SELECT status FROM saga.dead_letters") == "purged"
