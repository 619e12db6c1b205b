"""Take the admin screenshots in docs/ from a running ``make admin`` (headless Chromium).

    make admin &                     # serves the example on 127.0.0.1:8000
    .venv/bin/python example_project/screenshots.py [http://127.0.0.1:8000]
"""

from __future__ import annotations

import sys
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

DOCS = Path(__file__).resolve().parent.parent / "docs"


def main(base: str) -> None:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1400,700", "--hide-scrollbars"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(f"{base}/admin/login/")
        driver.find_element(By.NAME, "username").send_keys("admin")
        driver.find_element(By.NAME, "password").send_keys("admin")
        driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        driver.get(f"{base}/admin/django_sqlqueue/overview/")
        driver.save_screenshot(str(DOCS / "admin-overview.png"))
        driver.get(f"{base}/admin/django_sqlqueue/deadletter/?q=customer%3Dmallory")
        driver.save_screenshot(str(DOCS / "admin-dead-letters.png"))
    finally:
        driver.quit()


if __name__ == "__main__":
    main(sys.argv[1].rstrip("/") if len(sys.argv) > 1 else "http://127.0.0.1:8000")
