"""The dashboard in a real browser (headless Chromium) under hostile text and stolen
cookies.

Text from outside (saga names, steps, data and errors; dead letters' types, errors,
tracebacks, headers and payloads; the actions log; query strings) is shown as text on
every page: no injected script runs, no injected tag reaches the DOM, and the pages
carry no inline script. Signing out ends the session even for a tab left open with
the old cookie; a non-ASCII CSRF token is refused like any other bad one; a crafted
link cannot put words on a page. Screenshots cover the whole page, however tall.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from urllib.parse import quote, urlencode

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from saga.dashboard.security import SESSION_COOKIE
from saga.messaging.envelope import Envelope
from tests.support.browser import (
    Screenshots,
    chromium,
    click_and_load,
    dashboard_process,
    png_size,
    policy_violations,
)
from tests.support.databases import TestDatabase
from tests.support.services import Ping

TOKEN = "dashboard-token-for-tests"
#: Each tag carries ``data-injected``: none may reach the DOM, none may run.
HOSTILE = [
    "<script data-injected>window.__pwned = 1</script>",
    '<img data-injected src=x onerror="window.__pwned = 2">',
    '"><svg data-injected onload="window.__pwned = 3">',
    '\'><iframe data-injected srcdoc="<script>parent.__pwned = 4</script>"></iframe>',
    "</pre></textarea><b data-injected>bold</b>{{ 7*7 }} [bold]x[/bold] \x1b]0;t\x07 \u202eevil",
]
TRACEBACK = "\n".join(f"  line {i}: {HOSTILE[i % len(HOSTILE)]}" for i in range(30))
#: Step attempts of the hostile saga: enough for a page taller than any window.
STEPS = 100


def _hostile_database(db: TestDatabase) -> tuple[uuid.UUID, int]:
    """A saga, its steps, a dead letter and an action, every text field hostile."""
    saga_id = uuid.uuid4()
    data = {"note": HOSTILE[2], "items": [HOSTILE[4]], HOSTILE[0]: HOSTILE[3]}
    db.execute(
        "INSERT INTO saga.saga_instances (id, name, saga_version, service, status, step, data, "
        "last_error, idempotency_key, step_state, started_at, step_started_at) VALUES "
        "(%s, %s, 1, 'trips', 'running', %s, %s, %s, %s, %s, now(), now())",
        (
            saga_id,
            HOSTILE[0],
            HOSTILE[1],
            json.dumps(data),
            HOSTILE[3],
            HOSTILE[2],
            json.dumps({"waiting_for": HOSTILE[4]}),
        ),
    )
    for i in range(STEPS):
        db.execute(
            "INSERT INTO saga.saga_steps (saga_id, step, phase, attempt, outcome, started_at, "
            "finished_at, error, message_id) VALUES (%s, %s, 'forward', 1, 'failed', now(), "
            "now(), %s, %s)",
            (saga_id, HOSTILE[i % len(HOSTILE)], HOSTILE[(i + 1) % len(HOSTILE)], uuid.uuid4()),
        )
    envelope = Envelope.wrap(Ping(key=HOSTILE[1])).model_copy(
        update={"headers": {HOSTILE[0]: HOSTILE[3]}, "payload": {"x": HOSTILE[4]}}
    )
    letter = int(
        db.scalar(
            "INSERT INTO saga.dead_letters (consumer, reason, message_id, message_type, saga_id, "
            "destination, content_type, body, error_type, error_message, traceback) VALUES "
            "(%s, 'failed', %s, %s, %s, %s, 'application/json', %s, %s, %s, %s) RETURNING id",
            (HOSTILE[2], envelope.message_id, HOSTILE[0], saga_id, HOSTILE[1],
             envelope.to_bytes(), HOSTILE[4], HOSTILE[3], TRACEBACK),
        )
    )  # fmt: skip
    db.execute(
        "INSERT INTO saga.dashboard_actions (operator, client, action, target, result) "
        "VALUES (%s, %s, 'replay', %s, %s)",
        (HOSTILE[1], HOSTILE[2], json.dumps({HOSTILE[0]: HOSTILE[3]}), HOSTILE[4]),
    )
    return saga_id, letter


def _rejected_letter(db: TestDatabase) -> None:
    db.execute(
        "INSERT INTO saga.dead_letters (consumer, reason, message_id, message_type, "
        "destination, content_type, body, error_type, error_message) VALUES ('trips', "
        "'rejected', %s, %s, 'trips', 'application/json', '{}', 'UnknownMessageType', "
        "'nothing here handles this type')",
        (uuid.uuid4(), HOSTILE[0]),
    )


def _nothing_injected(driver: WebDriver) -> None:
    found = driver.execute_script(
        "return [window.__pwned === undefined ? null : window.__pwned,"
        " document.querySelectorAll('[data-injected]').length,"
        " document.querySelectorAll('script:not([src])').length]"
    )
    assert found == [None, 0, 0], (driver.current_url, found)


def test_hostile_text_is_shown_as_text_on_every_page(db: TestDatabase, tmp_path: Path) -> None:
    saga_id, letter = _hostile_database(db)
    group = urlencode({"consumer": HOSTILE[2], "reason": "failed", "error_type": HOSTILE[4]})
    filters = urlencode({"service": "trips", "name": HOSTILE[0], "text": HOSTILE[1]})
    pages = [
        "/", "/sagas", f"/sagas?{filters}", f"/sagas/trips/{saga_id}", "/dead-letters",
        f"/dead-letters/trips/{letter}", f"/dead-letters/trips/replay?{group}", "/actions",
        f"/sagas/trips/{quote(HOSTILE[0])}", f"/login?next={quote(HOSTILE[1])}",
    ]  # fmt: skip
    with dashboard_process({"trips": db.url}, tmp_path, TOKEN) as base, chromium() as browser:
        for page in pages:
            browser.get(base + page)
            _nothing_injected(browser)
        browser.get(f"{base}/sagas/trips/{saga_id}")
        shown = browser.find_element(By.TAG_NAME, "main").text
        assert HOSTILE[0] in shown and HOSTILE[1] in shown  # as written, as text
        assert browser.execute_script(
            "return Chart.getChart(document.getElementById('timeline')) !== undefined"
        )
        assert len(browser.find_elements(By.CSS_SELECTOR, "#steps tr.step")) == STEPS
        shot = Screenshots(browser, tmp_path).take("hostile-saga")
        page_height = browser.execute_script("return document.documentElement.scrollHeight")
        assert png_size(shot)[1] >= page_height > 2400, (png_size(shot), page_height)
        for _ in range(2):  # messages of a type nothing registered, published onto a queue
            _rejected_letter(db)
        browser.get(f"{base}/dead-letters/trips/replay?consumer=trips&reason=rejected")
        warning = browser.find_element(By.ID, "plan-warning").text
        assert "2 of them were rejected before any handler ran" in warning, warning
        browser.get(f"{base}/login?next={quote('javascript:window.__pwned = 5')}")
        browser.find_element(By.ID, "operator-name").send_keys("ada")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        click_and_load(browser, browser.find_element(By.ID, "sign-in-button"))
        assert browser.current_url == base + "/"
        _nothing_injected(browser)
        assert policy_violations(browser) == []


def test_a_signed_out_cookie_and_bad_tokens_can_do_nothing(
    db: TestDatabase, tmp_path: Path
) -> None:
    _saga_id, letter = _hostile_database(db)
    dry_run = f"/dead-letters/trips/replay?ids={letter}"
    with dashboard_process({"trips": db.url}, tmp_path, TOKEN) as base, chromium() as browser:
        browser.get(base + "/?" + urlencode({"problem": "Token leaked: run saga dlq purge"}))
        assert "Token leaked" not in browser.find_element(By.TAG_NAME, "body").text

        browser.get(f"{base}/login?next={quote(dry_run)}")
        browser.find_element(By.ID, "operator-name").send_keys("mallory")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        click_and_load(browser, browser.find_element(By.ID, "sign-in-button"))
        assert browser.current_url == base + dry_run
        browser.execute_script("document.querySelector('input[name=csrf]').value = 'é'")
        click_and_load(browser, browser.find_element(By.ID, "replay"))
        assert "refused" in browser.page_source and "CSRF" in browser.page_source

        browser.get(base + dry_run)  # a tab left open on the dry run
        stale_tab = browser.current_window_handle
        old_cookie = browser.get_cookie(SESSION_COOKIE)
        assert old_cookie is not None
        browser.switch_to.new_window("tab")
        browser.get(base + "/")
        click_and_load(
            browser, browser.find_element(By.CSS_SELECTOR, "form[action='/logout'] button")
        )
        assert browser.find_element(By.ID, "notice").text == "signed out"
        browser.add_cookie({"name": SESSION_COOKIE, "value": old_cookie["value"], "path": "/"})
        browser.get(base + "/")
        assert not browser.find_elements(By.ID, "operator")  # the old cookie names no one
        browser.switch_to.window(stale_tab)
        click_and_load(browser, browser.find_element(By.ID, "replay"))
        assert "refused: sign in" in browser.page_source
        assert policy_violations(browser) == []
    status = db.scalar("SELECT status FROM saga.dead_letters WHERE id = %s", (letter,))
    assert status == "pending"
    assert db.scalar("SELECT count(*) FROM saga.dead_letter_replays") == 0
