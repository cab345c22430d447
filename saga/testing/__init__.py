"""Testing sagas and handlers: a harness on a real PostgreSQL, in process, with a virtual clock.

>>> def test_order_completes(saga_harness):              # doctest: +SKIP
...     h = saga_harness(registry, services=[customers])
...     saga_id = h.start(create_order, OrderData(...))
...     h.expect_command("payments", ChargeCard(...)).reply(CardCharged(charge_id="c1"))
...     h.run_until_idle()
...     assert h.status(saga_id) == "completed"

The fixtures (``saga_harness``, ``saga_database``) come from the pytest plugin
``saga.testing.pytest_plugin``, registered as a ``pytest11`` entry point; the
rest of this package needs no pytest. See docs/testing.md.
"""

from saga.errors import ForeignDatabase, HarnessSetupError, PayloadMismatch
from saga.testing.clock import VirtualClock
from saga.testing.database import HarnessDatabase
from saga.testing.harness import Consumed, Run, SagaHarness, TimelineEntry
from saga.testing.messages import Message
from saga.testing.scenario import SagaScenario
from saga.testing.stubs import Fail, PendingCommand

__all__ = [
    "Consumed",
    "Fail",
    "ForeignDatabase",
    "HarnessDatabase",
    "HarnessSetupError",
    "Message",
    "PayloadMismatch",
    "PendingCommand",
    "Run",
    "SagaHarness",
    "SagaScenario",
    "TimelineEntry",
    "VirtualClock",
]
