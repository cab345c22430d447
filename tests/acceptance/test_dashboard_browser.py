"""The dashboard in a real browser (headless Chromium) over the order-saga example.

The example runs as processes on four databases; ``saga dashboard`` serves them. The
payment gateway is down, so five sagas are held at ``charge_payment``. An operator
walks from the overview to a held saga, reads why it is held, opens the dry run of
its letter's group, signs in (and lands back on the dry run), replays the five
letters once the gateway is back, and sees the saga completed: in at most
:data:`MOST_CLICKS` clicks, counted. Every page keeps working under the dashboard's
Content-Security-Policy, and what the pages say is checked against the databases.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import psycopg
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import SERVICES, Cluster
from saga.examples.order_saga.gateway import GatewayClient
from tests.rig.supervisor import Supervisor
from tests.support.browser import (
    Screenshots,
    Walk,
    chromium,
    dashboard_process,
    policy_violations,
)
from tests.support.example_cluster import gateway_answers
from tests.support.wait import wait_until

TOKEN = "dashboard-token-for-tests"
GOOD_ORDERS = 6
HELD_ORDERS = 5
#: The operator's path from the overview to a replayed, completed saga (issue 37).
MOST_CLICKS = 8


def _text(driver: WebDriver, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def _chart_sums(driver: WebDriver) -> list[int]:
    """The overview's chart as Chart.js drew it: sagas started and finished in all."""
    sums = driver.execute_script(
        "const chart = Chart.getChart(document.getElementById('activity'));"
        "return chart.data.datasets.map(d => d.data.reduce((a, b) => a + b, 0));"
    )
    return [int(n) for n in sums]


def _step_cells(driver: WebDriver, step: str) -> list[list[str]]:
    """The cells of the steps table's rows (attempts and waits) of ``step``."""
    rows = driver.find_elements(By.CSS_SELECTOR, "#steps tr.step, #steps tr.wait")
    cells = [[c.text for c in row.find_elements(By.TAG_NAME, "td")] for row in rows]
    return [c for c in cells if c[1] == step]


def _ms(text: str) -> float:
    return float(text.replace(",", ""))


def test_an_operator_replays_held_sagas_in_eight_clicks_and_the_pages_say_what_is_so(
    order_system: Cluster, tmp_path: Path
) -> None:
    order_system.extra_env.update(
        {"PAYMENTS_RETRY_DELAYS": "0.2,0.4", "ORDERS_CHARGE_ON_DEAD_LETTER": "hold"}
    )
    supervisor = Supervisor(order_system.commands(), tmp_path / "logs")
    gateway = GatewayClient(order_system.gateway_url)
    databases = {s: order_system.database_urls[s] for s in SERVICES}
    try:
        wait_until(lambda: gateway_answers(gateway), timeout=30, what="the payment gateway")
        good = workload.make_orders(GOOD_ORDERS, workload.FailureRates(0, 0, 0, 0), prefix="ok")
        workload.submit(order_system, good)
        wait_until(
            lambda: workload.status_counts(order_system) == {"completed": GOOD_ORDERS},
            timeout=120,
            what="the good orders completed",
        )
        gateway.set_faults(charges_down=True)
        held = workload.make_orders(HELD_ORDERS, workload.FailureRates(0, 0, 0, 0), prefix="held")
        workload.submit(order_system, held)
        wait_until(
            lambda: workload.status_counts(order_system).get("step_dead_lettered") == HELD_ORDERS,
            timeout=120,
            what="the sagas held at charge_payment",
        )
        with psycopg.connect(databases["payments"]) as conn:
            letter_id, attempts = conn.execute(
                "SELECT min(id), max(attempts) FROM saga.dead_letters"
            ).fetchone() or (None, None)
        broker = ("--broker-url", order_system.broker_url,
                  "--queue-prefix", order_system.queue_prefix)  # fmt: skip
        with (
            dashboard_process(databases, tmp_path, TOKEN, *broker) as base,
            chromium() as browser,
        ):
            shots = Screenshots(browser, tmp_path)
            browser.get(f"{base}/dead-letters/payments/{letter_id}")
            assert "ChargeCard" in browser.page_source
            assert "Traceback" in _text(browser, "#traceback")
            shots.take("dead-letter")

            browser.get(base + "/")
            orders = _text(browser, "#service-orders")
            assert "create_order" in orders and "completed" in orders, orders
            assert "step_dead_lettered" in orders
            assert _text(browser, "#service-payments .big") == str(HELD_ORDERS)
            queues = _text(browser, "#queues")
            assert f"{order_system.queue_prefix}payments" in queues, queues
            started, finished = _chart_sums(browser)  # drawn: the policy let the script run
            assert (started, finished) == (GOOD_ORDERS + HELD_ORDERS, GOOD_ORDERS)
            quiet = _text(browser, "#quiet-services")  # one line, not a block each
            assert all(s in quiet for s in ("customers", "inventory", "notifications")), quiet
            shots.take("overview")

            walk = Walk(browser)
            walk.click(
                browser.find_element(By.CSS_SELECTOR, "#service-orders a.status.step_dead_lettered")
            )
            rows = browser.find_elements(By.CSS_SELECTOR, "tr.saga-row")
            assert len(rows) == HELD_ORDERS and "charge_payment" in rows[0].text
            assert all("not finished" in r.find_element(By.CSS_SELECTOR, ".ended").text
                       for r in rows)  # fmt: skip
            shots.take("saga-list")
            walk.click(rows[0].find_element(By.CSS_SELECTOR, "a.saga-link"))

            assert _text(browser, "#saga-status") == "step_dead_lettered"
            held_rows = browser.find_elements(By.CSS_SELECTOR, "tr.step.outcome-held")
            assert held_rows and "charge_payment" in held_rows[0].text, _text(browser, "#steps")
            assert "held-" in _text(browser, "#saga-data")
            assert "tok_" not in _text(browser, "#saga-data")  # card_token is masked
            failed = _step_cells(browser, "charge_payment")[0]
            assert failed[3] == str(attempts), failed  # the participant's tries, not "1"
            shots.take("saga-held")
            saga_page = browser.current_url

            walk.click(browser.find_element(By.CSS_SELECTOR, "#saga-letters a.letter-group"))
            summary = _text(browser, "#plan-summary")
            assert f"{HELD_ORDERS} of {HELD_ORDERS} dead letter(s) in payments" in summary
            assert not browser.find_elements(By.ID, "plan-warning")  # they failed; not rejected
            preview = browser.current_url

            walk.click(browser.find_element(By.CSS_SELECTOR, "main a[href^='/login']"))
            browser.find_element(By.ID, "operator-name").send_keys("ada")
            browser.find_element(By.ID, "token").send_keys(TOKEN)
            walk.click(browser.find_element(By.ID, "sign-in-button"))
            assert browser.current_url == preview  # back where the operator was
            assert _text(browser, "#operator") == "ada"

            shots.take("replay-preview")
            browser.find_element(By.ID, "purge").click()  # not ticked: the browser refuses
            assert browser.execute_script(
                "return document.getElementById('confirm-purge').validity.valueMissing"
            )
            assert browser.current_url == preview

            gateway.set_faults(charges_down=False)  # the operator fixed the cause
            walk.click(browser.find_element(By.ID, "replay"))
            assert browser.current_url == saga_page
            assert f"replayed {HELD_ORDERS} dead letter(s)" in _text(browser, "#notice")
            wait_until(
                lambda: (
                    workload.status_counts(order_system) == {"completed": GOOD_ORDERS + HELD_ORDERS}
                ),
                timeout=120,
                what="the replayed sagas completed",
            )
            walk.reload()
            assert _text(browser, "#saga-status") == "completed"
            assert walk.clicks <= MOST_CLICKS, walk.clicks

            assert "approve_order" in _text(browser, "#steps")
            assert not browser.find_elements(By.ID, "last-error")  # completed: no red banner
            charge = _step_cells(browser, "charge_payment")
            assert [c[4] for c in charge] == [
                "failed", "held", "held, waiting for an operator's replay", "succeeded"
            ], charge  # fmt: skip
            wait, succeeded = charge[2], charge[3]
            assert succeeded[3].startswith(str(attempts + 1)), succeeded  # tries + the replay
            assert _ms(succeeded[6]) < _ms(wait[6]), (succeeded, wait)
            commands = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "tr.command")]
            assert len(commands) == len(set(commands)), commands  # each message once
            # A consumer deletes the rows it published once it is idle: nothing stays waiting.
            wait_until(
                lambda: browser.refresh() or not browser.find_elements(By.ID, "pending"),
                timeout=30,
                what="no message of the completed saga left waiting in an outbox",
            )
            shots.take("saga-completed")
            browser.get(base + "/actions")
            assert "ada" in _text(browser, "main") and "replay" in _text(browser, "main")
            assert policy_violations(browser) == []
    finally:
        supervisor.stop()


def test_the_dashboard_listens_on_this_machine_only_unless_told(
    order_system: Cluster, tmp_path: Path
) -> None:
    databases = {"orders": order_system.database_urls["orders"]}
    with dashboard_process(databases, tmp_path, None) as base:
        port = int(base.rsplit(":", 1)[1])
        listening = {
            c.laddr.ip
            for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        }
        assert listening == {"127.0.0.1"}
