"""The chaos decks: only the RabbitMQ run restarts the shared servers."""

from __future__ import annotations

import random

from examples.order_saga.chaos import BROKERS, _deck, kinds_of

SHARED = {"restart_rabbitmq", "restart_postgres"}


def test_only_the_rabbitmq_deck_restarts_the_shared_servers() -> None:
    for broker in BROKERS:
        deck = set(_deck(random.Random(1), kinds_of(broker)))
        assert deck == set(kinds_of(broker))
        assert bool(deck & SHARED) == (broker == "rabbitmq"), broker
    assert not any(k.startswith("restart") for k in kinds_of("postgres"))
