"""The saga SQL ceiling's script writer: captured parameters become pgbench expressions, and
only a bigint can stand for an outbox row (an attempt number in the same statement stays)."""

from __future__ import annotations

from bench.pgbench_script import Statement, _Script

MESSAGE = "01a23efb-8176-77bd-99a3-0f676e0a1478"
SQL = (
    "WITH saved AS (UPDATE t SET attempt = $1), "
    "gone AS (DELETE FROM saga.outbox WHERE id = ANY($2))"
)


def test_an_integer_that_is_not_a_row_id_stays_a_literal() -> None:
    script = _Script([], {1: MESSAGE}, {SQL: ["integer", "bigint[]"]})
    rendered = script.statement(Statement(SQL, ["1", "{1}"]))
    assert "attempt = ('1')::integer" in rendered
    # the row, found again by its message's replayed id (a uuid compared with a uuid)
    assert "WHERE message_id = md5(:saga::text || '/1')::uuid)::text" in rendered


def test_counts_beside_a_delete_of_rows_stay_counts() -> None:
    """A consumer's opening statement deletes the rows it published and counts the events
    among them nobody took: the counts are bigints in an outbox statement, not row ids."""
    sql = (
        "WITH gone AS (DELETE FROM saga.outbox WHERE id = ANY($1::bigint[])), "
        "counted AS (INSERT INTO saga.events_unrouted (message_type, events) "
        "SELECT * FROM unnest($2::text[], $3::bigint[]))"
    )
    script = _Script([], {1: MESSAGE}, {sql: ["bigint[]", "text[]", "bigint[]"]})
    rendered = script.statement(Statement(sql, ["{1}", "{OrderApproved}", "{1}"]))
    assert "('{1}')::bigint[]::bigint[]" in rendered  # $3: the count, as it was
    assert "WHERE message_id = md5(:saga::text || '/1')::uuid)::text" in rendered  # $1
