"""Headless Chromium (Debian's ``chromium`` and ``chromedriver``) driven by Selenium, and
the ``saga dashboard`` command as a subprocess, for the dashboard's browser tests."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from saga.examples.order_saga.processes import SagaProcess
from tests.support import servers
from tests.support.wait import wait_until

CHROMIUM_HINT = "apt-get install chromium chromium-driver (.ci/run installs them when missing)"
#: Set to a folder (docs/images) to keep the screenshots the browser tests take.
SCREENSHOTS_VAR = "SAGA_DASHBOARD_SCREENSHOTS"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 1.0):
            return True
    except OSError:
        return False


@contextmanager
def dashboard_process(
    databases: dict[str, str], log_dir: Path, token: str | None, *extra: str
) -> Iterator[str]:
    """``saga dashboard --db SERVICE=URL ...`` on a free port; yields its base URL."""
    port = free_port()
    args = ["dashboard", "--port", str(port), *extra]
    for service, url in databases.items():
        args += ["--db", f"{service}={url}"]
    env = {"PYTHONUNBUFFERED": "1", **({"SAGA_DASHBOARD_TOKEN": token} if token else {})}
    process = SagaProcess(args, env, log_dir, "dashboard")
    try:
        wait_until(
            lambda: answers(port) or process.returncode is not None,
            timeout=60,
            what="the dashboard to listen",
        )
        assert process.returncode is None, process.output()
        yield f"http://127.0.0.1:{port}"
    except BaseException:
        process.terminate(30)
        raise
    assert process.terminate(30) == 0, process.output()


@contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    """Headless Chromium through its chromedriver (no browser is downloaded)."""
    binary = servers.require_program("chromium", CHROMIUM_HINT)
    driver_path = servers.require_program("chromedriver", CHROMIUM_HINT)
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # for policy_violations
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--window-size=1400,1000", "--disable-gpu"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=DriverService(driver_path))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


#: How long a page may take to replace the one before it on a loaded machine.
PAGE_LOAD_S = 60


def click_and_load(driver: webdriver.Chrome, element: WebElement) -> None:
    """Click ``element`` and return once the page it leads to has replaced the current
    one: a click returns as soon as the browser took it, so reading the page right
    after would read the page being left (or a half-loaded one)."""
    leaving = driver.find_element("tag name", "html")
    element.click()
    WebDriverWait(driver, PAGE_LOAD_S).until(
        lambda _: _detached(leaving), f"no new page after {driver.current_url}"
    )
    WebDriverWait(driver, PAGE_LOAD_S).until(
        lambda d: d.execute_script("return document.readyState") == "complete",
        f"{driver.current_url} did not finish loading",
    )


def _detached(element: WebElement) -> bool:
    """Whether ``element`` is no longer in the page. Caught between two pages, Chromium
    may say so with an unknown error ("does not belong to the document") rather than a
    stale-element one."""
    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in (exc.msg or ""):
            return True
        raise
    return False


def policy_violations(driver: webdriver.Chrome) -> list[str]:
    """The browser console's messages about the Content-Security-Policy since the last
    call (Chromium logs each thing the policy refused)."""
    return [
        str(entry["message"])
        for entry in driver.get_log("browser")
        if "Content Security Policy" in str(entry.get("message", ""))
    ]


class Walk:
    """Counts the clicks (and reloads) an operator's path through the pages takes."""

    def __init__(self, driver: webdriver.Chrome) -> None:
        self.driver = driver
        self.clicks = 0

    def click(self, element: WebElement) -> None:
        self.clicks += 1
        click_and_load(self.driver, element)

    def reload(self) -> None:
        self.clicks += 1
        self.driver.refresh()


def png_size(path: Path) -> tuple[int, int]:
    """A PNG file's width and height in pixels (from its header)."""
    width, height = struct.unpack(">II", path.read_bytes()[16:24])
    return int(width), int(height)


class Screenshots:
    """Saves full-page screenshots (the whole page, however tall, not the window) in the
    test's folder, and in the folder ``SAGA_DASHBOARD_SCREENSHOTS`` names, if set (to
    refresh the docs' images)."""

    def __init__(self, driver: webdriver.Chrome, folder: Path) -> None:
        self.driver = driver
        self.folder = folder
        self.keep = os.environ.get(SCREENSHOTS_VAR)

    def take(self, name: str) -> Path:
        path = self.folder / f"dashboard-{name}.png"
        size = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": clip},
        )
        path.write_bytes(base64.b64decode(shot["data"]))
        if self.keep:
            shutil.copy(path, Path(self.keep) / path.name)
        return path
