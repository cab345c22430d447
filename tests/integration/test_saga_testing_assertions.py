"""saga.testing's matching assertions: sent(service, Type, where=...), assert_sent in any
order, and expect_command on a service that runs for real."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from saga import HandlerContext, Outbox, Service, Tx
from saga.testing import PayloadMismatch, SagaHarness
from tests.integration.test_saga_testing import HoldData, Reserve, Reserved, hold_registry


class Charge(BaseModel):
    order_id: str
    amount_cents: int


class Refund(BaseModel):
    order_id: str


def sent_to_bank(h: SagaHarness, *messages: BaseModel) -> None:
    with h.transaction() as tx:
        for message in messages:
            Outbox().add(tx, message, destination="bank")
    h.run_until_idle()


def test_sent_finds_the_matching_messages_as_their_model(saga_harness) -> None:
    h: SagaHarness = saga_harness()
    sent_to_bank(h, Charge(order_id="o-1", amount_cents=500), Refund(order_id="o-1"),
                 Charge(order_id="o-2", amount_cents=9000))  # fmt: skip

    [big] = h.sent("bank", Charge, where=lambda c: c.amount_cents > 1000)

    assert big == Charge(order_id="o-2", amount_cents=9000)
    assert len(h.sent("bank", Charge)) == 2
    assert len(h.sent) == 3  # still every message sent, in order


def test_sent_with_no_match_lists_what_was_sent(saga_harness) -> None:
    h: SagaHarness = saga_harness()
    sent_to_bank(h, Charge(order_id="o-1", amount_cents=500), Refund(order_id="o-1"))

    with pytest.raises(PayloadMismatch) as raised:
        h.sent("bank", Charge, where=lambda c: c.order_id == "o-9")

    message = str(raised.value)
    assert 'no Charge sent to bank that lambda c: c.order_id == "o-9" accepts' in message
    assert '<Charge to bank: {"amount_cents": 500, "order_id": "o-1"}>' in message
    assert '<Refund to bank: {"order_id": "o-1"}>' in message


def test_assert_sent_in_any_order(saga_harness) -> None:
    h: SagaHarness = saga_harness()
    sent_to_bank(h, Refund(order_id="o-1"), Charge(order_id="o-2", amount_cents=900))

    h.assert_sent("bank", Charge(order_id="o-2", amount_cents=900), Refund, any_order=True)
    with pytest.raises(PayloadMismatch):
        h.assert_sent("bank", Charge(order_id="o-2", amount_cents=900), Refund)  # in order


def test_assert_sent_in_any_order_shows_what_is_missing_and_what_is_extra(saga_harness) -> None:
    h: SagaHarness = saga_harness()
    sent_to_bank(h, Refund(order_id="o-1"), Charge(order_id="o-2", amount_cents=900))

    with pytest.raises(PayloadMismatch) as raised:
        h.assert_sent("bank", Charge(order_id="o-2", amount_cents=100), any_order=True)

    message = str(raised.value)
    assert "messages sent to bank, in any order, differ:" in message
    assert 'expected, not sent: <Charge: {"amount_cents": 100, "order_id": "o-2"}>' in message
    assert "amount_cents  100       900       <-- differs" in message
    assert 'sent, not expected: <Refund to bank: {"order_id": "o-1"}>' in message


def test_a_type_alone_takes_what_the_whole_messages_leave(saga_harness) -> None:
    h: SagaHarness = saga_harness()
    sent_to_bank(h, Charge(order_id="o-1", amount_cents=1), Charge(order_id="o-2", amount_cents=2))

    h.assert_sent("bank", Charge, Charge(order_id="o-1", amount_cents=1), any_order=True)
    with pytest.raises(PayloadMismatch, match="expected, not sent: a Charge"):
        h.assert_sent("bank", Charge, Charge, Charge, any_order=True)


def test_expect_command_on_a_real_service_says_it_runs_for_real(saga_harness) -> None:
    registry, hold = hold_registry()
    vault = Service("vault")

    @vault.handler(Reserve)
    def reserve(tx: Tx, cmd: Reserve, ctx: HandlerContext) -> Reserved:
        return Reserved(reservation_id="r-" + cmd.order_id)

    h: SagaHarness = saga_harness(registry, services=[vault])
    h.start(hold, HoldData(order_id="o-1"))

    with pytest.raises(AssertionError, match="'vault' runs for real in this harness") as raised:
        h.expect_command("vault", Reserve)
    assert "assert_consumed('vault', ...)" in str(raised.value)
