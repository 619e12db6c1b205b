"""End to end in a real headless Chromium: an operator finds a poison message and replays it.

Debian's ``chromium`` and ``chromium-driver`` packages, driven by Selenium; nothing is
downloaded at run time (.ci/provision installs both). A real runqueueworker consumes.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

import django_sqlqueue as sqlqueue
from django_sqlqueue import operations
from django_sqlqueue.models import DeadLetter
from tests import backends
from tests.testapp.models import Handled
from tests.worker_harness import wait_until, worker_pool

pytestmark = [pytest.mark.worker, pytest.mark.browser]

CHROMIUM = os.environ.get("SQLQUEUE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("SQLQUEUE_CHROMEDRIVER", "/usr/bin/chromedriver")
PAGE_TIMEOUT = 20.0  # seconds the operator waits for something to show on a page


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install 'django-sqlqueue[dev]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture
def browser() -> Iterator[object]:
    reason = _missing()
    if reason:
        if backends.is_ci():
            pytest.fail(f"the browser test needs {reason}")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1400,900"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def operator() -> User:
    """A staff member who may look at everything and replay, nothing else."""
    user = User.objects.create_user("operator", password="night-shift", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label="django_sqlqueue",
        codename__in=["view_overview", "view_deadletter", "replay_deadletter",
                      "view_queuemessage", "view_partition", "view_subscriber"]))
    return user


def shown_lag(driver, group: str, topic: str) -> int | None:
    from selenium.webdriver.common.by import By

    cells = driver.find_elements(
        By.CSS_SELECTOR, f'tr[data-group="{group}"][data-topic="{topic}"] [data-lag]')
    return int(cells[0].get_attribute("data-lag")) if cells else None


def find(driver, css: str):
    """The element, once the page that has it has loaded (a click returns before that)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, PAGE_TIMEOUT).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css)))


def reload_until(driver, predicate, what: str, timeout: float = PAGE_TIMEOUT):
    """Reload the page until ``predicate(driver)`` holds, as an operator would."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate(driver)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"the page never showed {what}")
        time.sleep(0.3)
        driver.refresh()


def test_an_operator_finds_the_poison_message_by_payload_and_replays_it_after_the_fix(
        browser, workers, live_server, tmp_path: Path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    operator()
    broken = tmp_path / "payments-broken"
    broken.touch()
    sqlqueue.publish("checkout", {"customer_id": 4242, "broken_while": str(broken)}, key="cart-9")
    sqlqueue.publish("checkout", {"customer_id": 7}, key="cart-1")
    worker = workers.start("w", "--topic", "checkout")

    # Log in and open the overview from the admin index.
    driver.get(live_server.url + reverse("admin:index"))
    driver.find_element(By.NAME, "username").send_keys("operator")
    driver.find_element(By.NAME, "password").send_keys("night-shift")
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    overview = reverse("admin:django_sqlqueue_overview")
    find(driver, f'a[href="{overview}"]').click()
    assert find(driver, "#sqlqueue-overview")

    # The payments group lags while its handler fails on the poison message.
    reload_until(driver, lambda d: (shown_lag(d, "payments", "checkout") or 0) > 0,
                 "lag for payments")
    assert worker.alive
    shots = Path(os.environ.get("SQLQUEUE_SCREENSHOTS", tmp_path))
    driver.save_screenshot(str(shots / "admin-overview-failing.png"))

    # It gives up on the message; the operator finds it by the customer in its payload.
    wait_until(lambda: DeadLetter.objects.exists(), what="the dead letter", watch=[worker])
    driver.get(live_server.url + reverse("admin:django_sqlqueue_deadletter_changelist"))
    search = find(driver, "#searchbar")
    search.send_keys("customer_id=4242")
    search.submit()
    find(driver, "#searchbar[value='customer_id=4242']")  # the results page has loaded
    rows = driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 1
    assert "payment provider refused customer 4242" in rows[0].text
    driver.save_screenshot(str(shots / "admin-dead-letters.png"))

    # The fix is deployed; the operator replays the message.
    broken.unlink()
    rows[0].find_element(By.CSS_SELECTOR, "input.action-select").click()
    Select(driver.find_element(By.NAME, "action")).select_by_value("replay_dead_letters")
    driver.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    assert "Replay 1 dead letter" in find(driver, "#sqlqueue-confirm-count").text
    find(driver, "#sqlqueue-confirm").click()
    assert "Replayed 1 dead letter" in find(driver, "ul.messagelist").text

    # The lag returns to 0: the replayed message was handled by payments, and only by it.
    driver.get(live_server.url + overview)
    reload_until(driver, lambda d: shown_lag(d, "payments", "checkout") == 0
                 and Handled.objects.filter(group="payments", payload__customer_id=4242).count() == 4,
                 "payments caught up after the replay")
    assert Handled.objects.filter(group="emails", payload__customer_id=4242).count() == 1
    assert [r.lag for r in operations.overview(topic="checkout")] == [0, 0]
    assert not DeadLetter.objects.exists()
