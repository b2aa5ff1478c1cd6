"""The DLQ console end to end in a real headless Chromium: scripts/console.py serving a DLQ of
three error groups, a group replayed through the page (dry run, then confirm), and the broker
checked afterwards: the messages are on the work queue, the group is gone from the DLQ and
from the page.

Set ``AMQP_LAB_CONSOLE_SCREENSHOT=docs/console.png`` to keep the index's screenshot there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from amqp_lab.settings import BrokerSettings
from tests.console_support import CUSTOMERS, THREE_GROUPS, fill_dlq, free_port
from tests.support import NAMES, get_all, start_script, wait_for, wait_ready_count

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
TOKEN = "browser-test-token"


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """Headless Chromium through Debian's chromedriver (never selenium-manager: no internet)."""
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        pytest.skip(
            f"needs {CHROMIUM} and {CHROMEDRIVER} (apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        "--window-size=1280,800",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def served(topology: BrokerSettings, tmp_path: Path) -> Iterator[str]:
    """scripts/console.py on a free port for a DLQ of three groups (3 + 2 + 1); its base URL."""
    fill_dlq(topology, THREE_GROUPS)
    wait_ready_count(topology, NAMES.dlq, len(THREE_GROUPS))
    port = free_port()
    process = start_script(
        topology,
        "console.py",
        "--port",
        str(port),
        "--token",
        TOKEN,
        "--audit-log",
        str(tmp_path / "audit.jsonl"),
    )
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"console.py exited {process.returncode}: {out}{err}")
        try:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            return httpx.get(f"{base}/", headers=headers, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(answers, timeout=30, what="the console to answer")
        yield base
    finally:
        process.terminate()
        try:
            out, err = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
    assert out.startswith(f"DLQ console for {NAMES.dlq} in vhost {topology.vhost!r}")
    assert TOKEN not in out + err  # the request log masks ?token=
    assert f":{topology.password}@" not in out + err  # the URL is shown masked


def groups_on_page(driver: WebDriver) -> dict[str, int]:
    """{error type: count} of the index page's group rows."""
    rows = driver.find_elements(By.CSS_SELECTOR, "tr.group")
    return {
        row.find_element(By.CSS_SELECTOR, ".etype").text: int(
            row.find_element(By.CSS_SELECTOR, ".count").text
        )
        for row in rows
    }


def element(driver: WebDriver, element_id: str) -> WebElement:
    """The element with ``element_id`` once the page showing it has loaded (a click returns
    before the navigation it starts has finished)."""
    found: WebElement = WebDriverWait(driver, 20).until(
        expected_conditions.presence_of_element_located((By.ID, element_id))
    )
    return found


def fit_window_to_page(driver: WebDriver) -> None:
    """Make the viewport as tall as the page's content, for a screenshot of all of it."""
    needed = int(
        driver.execute_script(
            "return Math.ceil(document.querySelector('main').getBoundingClientRect().bottom)"
        )
    )
    inner = int(driver.execute_script("return window.innerHeight"))
    size = driver.get_window_size()
    driver.set_window_size(size["width"], size["height"] + needed - inner)


def test_replay_a_group_through_the_page(
    browser: WebDriver, served: str, topology: BrokerSettings, tmp_path: Path
) -> None:
    driver = browser
    driver.get(f"{served}/?token={TOKEN}")
    assert "token" not in driver.current_url
    assert groups_on_page(driver) == {"BusinessError": 3, "TimeoutError": 2, "ZeroDivisionError": 1}
    fit_window_to_page(driver)
    shot = tmp_path / "console.png"
    assert driver.save_screenshot(str(shot))
    if os.environ.get("AMQP_LAB_CONSOLE_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["AMQP_LAB_CONSOLE_SCREENSHOT"])

    driver.find_element(By.LINK_TEXT, "BusinessError").click()
    assert element(driver, "group-count").text == "3"
    group_url = driver.current_url
    element(driver, "replay-group").click()
    heading = element(driver, "dry-run").text
    assert heading.startswith("Replay 3 records?") and "dry run" in heading
    listed = driver.find_elements(By.CSS_SELECTOR, "#dry-run-records tr.record")
    assert sorted(row.text.split()[0] for row in listed) == [f.message_id for f in CUSTOMERS]
    assert get_all(topology, NAMES.queue) == []  # the dry run sent nothing
    rate = element(driver, "rate")
    rate.clear()
    rate.send_keys("100")
    element(driver, "confirm").click()
    assert element(driver, "result").text == "3 records replayed"

    replayed = wait_for(lambda: get_all(topology, NAMES.queue), what="the replayed messages")
    assert sorted(p.message_id for _, p, _ in replayed) == [f.message_id for f in CUSTOMERS]
    wait_ready_count(topology, NAMES.dlq, 3)
    driver.get(f"{served}/")
    assert groups_on_page(driver) == {"TimeoutError": 2, "ZeroDivisionError": 1}
    driver.get(group_url)
    assert "404" in element(driver, "error").text
    audit = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert len(audit) == 3 and all('"status": "replayed"' in line for line in audit)
