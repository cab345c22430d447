"""The dashboard's ASGI app over a test database, and what its tests share: signing
in, dead letters and sagas to act on, and a snapshot of everything an action changes."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from starlette.testclient import TestClient

from saga.dashboard.app import DashboardConfig, create_app
from saga.dashboard.databases import Databases, ServiceDatabase
from saga.dashboard.security import Guard
from saga.messaging.envelope import Envelope
from tests.support import sagas as trips
from tests.support.databases import TestDatabase
from tests.support.services import EFFECTS_DDL, Ping

TOKEN = "s3cret-dashboard-token"
#: The CSRF token in a page's action forms.
CSRF_FIELD = re.compile(r'name="csrf" value="([^"]+)"')


@contextmanager
def dashboard_client(db: TestDatabase, guard: Guard) -> Iterator[TestClient]:
    """The dashboard over ``db`` (as service ``trips``), redirects not followed."""
    databases = Databases([ServiceDatabase("trips", db.url)])
    with TestClient(create_app(DashboardConfig(databases, guard)), follow_redirects=False) as c:
        yield c


def sign_in(client: TestClient, operator: str = "ada", saga_id: uuid.UUID | None = None) -> str:
    """Sign in; return the CSRF token the pages' action forms carry (read on the page
    of ``saga_id``, or of any running saga)."""
    response = client.post("/login", data={"token": TOKEN, "operator": operator})
    assert response.status_code == 303, response.text
    page = f"/sagas/trips/{saga_id}" if saga_id else any_saga_page(client.get("/sagas").text)
    found = CSRF_FIELD.search(client.get(page).text)
    assert found, "no action form on a running saga's page"
    return found.group(1)


def any_saga_page(list_page: str) -> str:
    found = re.search(r'href="(/sagas/trips/[0-9a-f-]{36})"', list_page)
    assert found
    return found.group(1)


def dead_letter(
    db: TestDatabase, payload: dict[str, Any] | None = None, reason: str = "failed"
) -> int:
    envelope = Envelope.wrap(Ping(key=str(uuid.uuid4())))
    if payload is not None:
        envelope = envelope.model_copy(update={"payload": payload})
    return int(
        db.scalar(
            "INSERT INTO saga.dead_letters (consumer, reason, message_id, message_type, "
            "destination, content_type, body, error_type, error_message, traceback) VALUES "
            "('bank', %s, %s, %s, 'bank', 'application/json', %s, 'GatewayTimeout', "
            "'the gateway took too long', 'Traceback: gateway.py line 7') RETURNING id",
            (reason, envelope.message_id, envelope.type, envelope.to_bytes()),
        )
    )


def start_trip(db: TestDatabase, trip_id: str) -> uuid.UUID:
    db.execute(EFFECTS_DDL)  # the trip saga's local steps write there
    with db.connect(autocommit=False) as conn, conn.transaction():
        return trips.trip.start(conn, trips.TripData(trip_id=trip_id))


def state(db: TestDatabase) -> tuple[Any, ...]:
    """Everything an action could change."""
    return (
        db.rows("SELECT id, status, replay_count FROM saga.dead_letters ORDER BY id"),
        db.rows("SELECT message_id FROM saga.outbox ORDER BY id"),
        db.rows("SELECT id, status, cancel_requested, version FROM saga.saga_instances"),
        db.scalar("SELECT count(*) FROM saga.dashboard_actions"),
        db.scalar("SELECT count(*) FROM saga.dead_letter_replays"),
    )
