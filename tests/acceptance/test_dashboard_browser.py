"""The dashboard in a real browser (headless Chromium) over the order-saga example.

The example runs as processes on four databases; ``saga dashboard`` serves them. An
operator sees the sagas on the overview, finds the saga held at ``charge_payment`` (the
payment gateway was down) by filtering, reads its timeline, fixes the gateway, replays
the dead letter from the page, and sees the saga complete.
"""

from __future__ import annotations

from pathlib import Path

import psutil
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from saga.examples.order_saga import workload
from saga.examples.order_saga.cluster import SERVICES, Cluster
from saga.examples.order_saga.gateway import GatewayClient
from saga.examples.order_saga.supervisor import Supervisor
from tests.support.browser import Screenshots, chromium, click_and_load, dashboard_process
from tests.support.example_cluster import gateway_answers
from tests.support.wait import wait_until

TOKEN = "dashboard-token-for-tests"
GOOD_ORDERS = 6


def _text(driver: WebDriver, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def test_an_operator_finds_a_held_saga_replays_its_letter_and_sees_it_complete(
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
        held = workload.make_orders(1, workload.FailureRates(0, 0, 0, 0), prefix="held")
        workload.submit(order_system, held)
        wait_until(
            lambda: workload.status_counts(order_system).get("step_dead_lettered") == 1,
            timeout=120,
            what="the saga held at charge_payment",
        )
        broker = ("--broker-url", order_system.broker_url,
                  "--queue-prefix", order_system.queue_prefix)  # fmt: skip
        with (
            dashboard_process(databases, tmp_path, TOKEN, *broker) as base,
            chromium() as browser,
        ):
            shots = Screenshots(browser, tmp_path)
            browser.get(base + "/")
            orders = _text(browser, "#service-orders")
            assert "create_order" in orders and "completed" in orders, orders
            assert "step_dead_lettered" in orders
            assert _text(browser, "#service-payments .big") == "1"
            queues = _text(browser, "#queues")
            assert f"{order_system.queue_prefix}payments" in queues, queues
            shots.take("overview")

            browser.get(base + "/sagas")
            Select(browser.find_element(By.NAME, "service")).select_by_value("orders")
            Select(browser.find_element(By.ID, "status-filter")).select_by_value(
                "step_dead_lettered"
            )
            browser.find_element(By.ID, "text-filter").send_keys("held-")
            click_and_load(browser, browser.find_element(By.ID, "apply-filters"))
            rows = browser.find_elements(By.CSS_SELECTOR, "tr.saga-row")
            assert len(rows) == 1 and "charge_payment" in rows[0].text, [r.text for r in rows]
            shots.take("saga-list")
            click_and_load(browser, rows[0].find_element(By.CSS_SELECTOR, "a.saga-link"))

            assert _text(browser, "#saga-status") == "step_dead_lettered"
            held_rows = browser.find_elements(By.CSS_SELECTOR, "tr.step.outcome-held")
            assert held_rows and "charge_payment" in held_rows[0].text, _text(browser, "#steps")
            assert "held-000000" in _text(browser, "#saga-data")
            assert "tok_" not in _text(browser, "#saga-data")  # card_token is masked
            shots.take("saga-held")
            saga_page = browser.current_url

            click_and_load(
                browser, browser.find_element(By.CSS_SELECTOR, "#saga-letters a.letter-link")
            )
            assert "ChargeCard" in browser.page_source
            assert "Traceback" in _text(browser, "#traceback")
            shots.take("dead-letter")
            click_and_load(browser, browser.find_element(By.ID, "preview-letter"))
            assert "1 of 1 dead letter(s) in payments would be replayed" in _text(
                browser, "#plan-summary"
            )
            preview = browser.current_url

            browser.get(base + "/login")
            browser.find_element(By.ID, "operator-name").send_keys("ada")
            browser.find_element(By.ID, "token").send_keys(TOKEN)
            click_and_load(browser, browser.find_element(By.ID, "sign-in-button"))
            assert _text(browser, "#operator") == "ada"

            gateway.set_faults(charges_down=False)  # the operator fixed the cause
            browser.get(preview)
            shots.take("replay-preview")
            click_and_load(browser, browser.find_element(By.ID, "replay"))
            assert "replayed 1 dead letter(s)" in _text(browser, "#notice")

            wait_until(
                lambda: workload.status_counts(order_system) == {"completed": GOOD_ORDERS + 1},
                timeout=120,
                what="the replayed saga completed",
            )
            browser.get(saga_page)
            assert _text(browser, "#saga-status") == "completed"
            assert "approve_order" in _text(browser, "#steps")
            shots.take("saga-completed")
            browser.get(base + "/actions")
            assert "ada" in _text(browser, "main") and "replay" in _text(browser, "main")
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
