"""The chaos decks: only the RabbitMQ run restarts the shared servers; the others crash
servers of their own."""

from __future__ import annotations

import random

from tests.rig.chaos import BROKERS, _deck, kinds_of

SHARED = {"restart_rabbitmq", "restart_postgres"}


def test_only_the_rabbitmq_deck_restarts_the_shared_servers() -> None:
    for broker in BROKERS:
        deck = set(_deck(random.Random(1), kinds_of(broker)))
        assert deck == set(kinds_of(broker))
        assert bool(deck & SHARED) == (broker == "rabbitmq"), broker
    assert "restart_private_postgres" in kinds_of("postgres")
    assert "restart_redis" in kinds_of("redis")
