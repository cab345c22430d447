"""A user's saga tests, with saga.testing's fixtures, from the installed wheel in an empty folder.

The wheel is built and installed in a fresh virtualenv as in ``test_demo_wheel``
(third-party packages, pytest included, come from this run's environment
through a ``.pth``). The user's test file is written into an empty folder: no
``tests/`` folder, no conftest.py, no checkout on the path. Its fixtures come
from the plugin the wheel registers (``pytest11``); its database is a fresh,
unmigrated one on the test server.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.acceptance.test_demo_wheel import build_wheel, fresh_venv
from tests.support.databases import TestDatabase

USER_TESTS = '''
"""A trip: book seats, then pay; a refused payment cancels the booking."""

import pytest
from pydantic import BaseModel

from saga import Saga, SagaRegistry, Service
from saga.testing import SagaHarness


class Book(BaseModel):
    trip_id: str
    seats: int


class Booked(BaseModel):
    booking_id: str


class Cancel(BaseModel):
    booking_id: str


class Pay(BaseModel):
    trip_id: str


class Paid(BaseModel):
    receipt: str


class TripData(BaseModel):
    trip_id: str
    seats: int
    booking_id: str | None = None


trip = Saga("trip", data=TripData)
trip.remote(
    "book",
    service="seats",
    command=lambda d: Book(trip_id=d.trip_id, seats=d.seats),
    reply=Booked,
    on_reply=lambda d, r: d.model_copy(update={"booking_id": r.booking_id}),
    compensate=lambda d: Cancel(booking_id=d.booking_id),
)
trip.remote("pay", service="bank", command=lambda d: Pay(trip_id=d.trip_id), reply=Paid)
registry = SagaRegistry("trips")
registry.register(trip)

seats = Service("seats")
SCHEMA = """CREATE TABLE IF NOT EXISTS bookings (
    id text PRIMARY KEY, seats int NOT NULL, cancelled boolean NOT NULL DEFAULT false)"""


@seats.handler(Book)
def book(tx, cmd: Book, ctx) -> Booked:
    booking_id = "b-" + cmd.trip_id
    tx.execute("INSERT INTO bookings (id, seats) VALUES (%s, %s)", (booking_id, cmd.seats))
    return Booked(booking_id=booking_id)


@seats.handler(Cancel)
def cancel(tx, cmd: Cancel, ctx) -> None:
    tx.execute("UPDATE bookings SET cancelled = true WHERE id = %s", (cmd.booking_id,))


@pytest.fixture
def h(saga_harness) -> SagaHarness:
    return saga_harness(registry, services=[seats], schema=[SCHEMA])


def test_a_paid_trip_completes(h):
    saga_id = h.start(trip, TripData(trip_id="t1", seats=2))
    h.expect_command("bank", Pay(trip_id="t1")).reply(Paid(receipt="r-1"))
    h.run_until_idle()
    assert h.status(saga_id) == "completed"
    assert h.rows("SELECT id, cancelled FROM bookings") == [("b-t1", False)]


def test_a_refused_payment_cancels_the_booking(h):
    saga_id = h.start(trip, TripData(trip_id="t2", seats=3))
    h.expect_command("bank", Pay).fail("card refused")
    h.run_until_idle()
    assert h.status(saga_id) == "compensated"
    h.assert_consumed("seats", Book(trip_id="t2", seats=3), Cancel(booking_id="b-t2"))
    assert h.rows("SELECT cancelled FROM bookings") == [(True,)]
'''

#: Beside the user's tests: the framework and the plugin's entry point are the wheel's (the
#: third-party packages' folder also holds this checkout's editable install, entry point included).
FROM_THE_WHEEL = """
import sys

import saga


def test_the_framework_and_its_fixtures_come_from_the_wheel(pytestconfig):
    assert saga.__file__.startswith(sys.prefix), saga.__file__
    plugins = pytestconfig.pluginmanager.list_plugin_distinfo()
    [where] = [d.locate_file("") for _, d in plugins if d.project_name == "saga-outbox"]
    assert str(where).startswith(sys.prefix), where
"""

#: A bug planted in the user's compensation: it cancels the trip id, not the booking's.
PLANTED_BUG = (
    "compensate=lambda d: Cancel(booking_id=d.booking_id)",
    "compensate=lambda d: Cancel(booking_id=d.trip_id)",
)


def pytest_in(
    folder: Path, venv: Path, *args: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_users_saga_tests_run_from_the_installed_wheel(
    tmp_path: Path, empty_db: TestDatabase
) -> None:
    venv = fresh_venv(tmp_path, build_wheel(tmp_path))
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "test_trip.py").write_text(USER_TESTS)
    (folder / "test_installed.py").write_text(FROM_THE_WHEEL)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SAGA_", "PYTEST_")) and k != "PYTHONPATH"}  # fmt: skip

    passed = pytest_in(folder, venv, "--saga-database-url", empty_db.url, env=env)
    assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-3000:]
    assert "3 passed" in passed.stdout

    (folder / "test_trip.py").write_text(USER_TESTS.replace(*PLANTED_BUG))
    failed = pytest_in(folder, venv, env={**env, "SAGA_TEST_DATABASE_URL": empty_db.url})
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    assert "1 failed, 2 passed" in failed.stdout
    assert "PayloadMismatch: messages seats consumed #2 differs" in failed.stdout
    # the expected and the actual booking id, side by side
    assert re.search(r'booking_id +"b-t2" +"t2" +<-- differs', failed.stdout), failed.stdout
